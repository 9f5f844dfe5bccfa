import csv
import json

import pytest

from segscale.training.run import train


def test_training_ends_with_an_evaluation_report(make_config, tmp_path):
    summary = train(make_config())
    folder = tmp_path / "run" / "evaluation"
    report = json.loads((folder / "metrics.json").read_text())
    assert report["GlobalAccuracy"] == pytest.approx(summary["metrics"]["val/acc"], abs=1e-5)
    assert report["MeanIoU"] == pytest.approx(summary["metrics"]["val/mIoU"], abs=1e-5)
    with open(folder / "confusion_matrix.csv") as stream:
        rows = list(csv.reader(stream))
    assert rows[0][1:] == list(summary_classes := make_config().datamodule.class_names)
    assert sum(int(v) for row in rows[1:] for v in row[1:]) == 192 * 192  # every pixel once
    with open(folder / "class_metrics.csv") as stream:
        assert [r["class"] for r in csv.DictReader(stream)] == list(summary_classes)
    for png in ("confusion_matrix.png", "sample_predictions.png"):
        assert (folder / png).read_bytes()[:4] == b"\x89PNG"
