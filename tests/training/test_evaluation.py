import csv
import json

import pytest

from segscale.training.run import train


def test_training_ends_with_an_evaluation_report(make_config, tmp_path, monkeypatch):
    from segscale.training import evaluation
    from segscale.training.callbacks import validation_report

    drawn = {}
    for module, name in (
        (evaluation, "plot_confusion_matrix"),
        (validation_report, "plot_sample_predictions"),
    ):
        original = getattr(module, name)

        def recording(*args, _name=name, _original=original):
            drawn[_name] = args
            _original(*args)

        monkeypatch.setattr(module, name, recording)
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
    # The confusion matrix is the last validation's, and says when it was taken.
    assert drawn["plot_confusion_matrix"][3] == "Validation confusion matrix at iteration 8"
    # Samples are whole validation images (the one 192×192 tile), not 64×64 grid patches.
    samples, *_, title = drawn["plot_sample_predictions"]
    assert [s.truth.shape for s in samples] == [(192, 192)]
    assert samples[0].prediction.shape == (192, 192) and samples[0].image.shape == (192, 192, 3)
    assert samples[0].caption == "validation image 1 of 1: 0000.png, 192×192 px"
    assert title == "Final network (iteration 8) on whole validation images"
