import csv
import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
import torch

from segscale.runs import evaluation
from segscale.runs.evaluation import CONFUSION_UNIT, confusion_matrix_figure
from segscale.training.callbacks import validation_report
from segscale.training.callbacks.validation_report import ValidationReport
from segscale.training.run.training_run import train
from tests.conftest import compose_config, tiny_overrides


@pytest.fixture(scope="module")
def reported(tiny_data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One tiny run of the default config, read by the tests of its report.

    It records what the figures were drawn with (``drawn``), and, at the report, the
    last validation's captured predictions of the samples and the same tiles predicted
    again (``seen``), the report itself drawing them with ``_predict`` made to fail.
    """
    run = tmp_path_factory.mktemp("reported") / "run"
    cfg = compose_config("train", *tiny_overrides(tiny_data_root, run))
    drawn: dict = {}
    seen: dict = {}
    original_plot = ValidationReport._plot_samples

    def compare_then_plot(self, trainer, module):
        picks = list(self._captured.canvases)
        seen["captured"] = [self._captured.canvases[t] for t in picks]
        seen["again"] = ValidationReport._predict(module, trainer.datamodule.val_set, picks, 16)
        with mock.patch.object(ValidationReport, "_predict", side_effect=AssertionError):
            original_plot(self, trainer, module)

    with pytest.MonkeyPatch.context() as patch:
        for module, name in (
            (evaluation, "plot_confusion_matrix"),
            (validation_report, "plot_sample_predictions"),
        ):
            original = getattr(module, name)

            def recording(*args, _name=name, _original=original):
                drawn[_name] = args
                _original(*args)

            patch.setattr(module, name, recording)
        patch.setattr(ValidationReport, "_plot_samples", compare_then_plot)
        summary = train(cfg)
    return SimpleNamespace(cfg=cfg, summary=summary, run=run, drawn=drawn, seen=seen)


def test_training_ends_with_an_evaluation_report(reported):
    summary, drawn = reported.summary, reported.drawn
    folder = reported.run / "evaluation"
    report = json.loads((folder / "metrics.json").read_text())
    # The network the run hands over (training.output_network=best-validation): best.ckpt's.
    best = torch.load(reported.run / "checkpoints" / "best.ckpt", weights_only=False)
    assert report["network"] == {
        "checkpoint": "best.ckpt",
        "epoch": best["epoch"],
        "step": best["global_step"],
    }
    assert report["MeanIoU"] == pytest.approx(summary["best_score"], abs=1e-5)
    with open(folder / "confusion_matrix.csv") as stream:
        rows = list(csv.reader(stream))
    assert rows[0][1:] == list(summary_classes := reported.cfg.datamodule.class_names)
    assert sum(int(v) for row in rows[1:] for v in row[1:]) == 192 * 192  # every pixel once
    with open(folder / "class_metrics.csv") as stream:
        assert [r["class"] for r in csv.DictReader(stream)] == list(summary_classes)
    for png in ("confusion_matrix.png", "sample_predictions.png"):
        assert (folder / png).read_bytes()[:4] == b"\x89PNG"
    # The confusion matrix says which validation it is.
    step = best["global_step"]
    assert drawn["plot_confusion_matrix"][3] == f"Validation confusion matrix at iteration {step}"
    # Samples are whole validation images (the one 192×192 tile), not 64×64 grid patches.
    samples, *_, title = drawn["plot_sample_predictions"]
    assert [s.truth.shape for s in samples] == [(192, 192)]
    assert samples[0].prediction.shape == (192, 192) and samples[0].image.shape == (192, 192, 3)
    assert samples[0].caption == "validation image 1 of 1: 0000.png, 192×192 px"
    assert title == "Final network (iteration 8) on whole validation images"


def test_the_samples_are_the_last_validations_own_predictions_not_predicted_again(reported):
    seen = reported.seen
    assert len(seen["captured"]) == 1
    np.testing.assert_array_equal(seen["captured"][0], seen["again"][0])


def test_samples_are_predicted_again_where_the_last_validation_left_tiles_out(
    make_config, tmp_path, monkeypatch
):
    calls = []
    original = ValidationReport._predict

    def counting(*args):
        calls.append(args[2])
        return original(*args)

    monkeypatch.setattr(ValidationReport, "_predict", staticmethod(counting))
    # One validation batch of 4 of the tile's 9 grid patches.
    train(
        make_config(
            "datamodule.val_batch_size=4",
            "trainer.limit_val_batches=1",
            "trainer.max_epochs=1",  # its one validation is the last
        )
    )
    assert calls == [[0]]
    png = tmp_path / "run" / "evaluation" / "sample_predictions.png"
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_final_validations_report_is_written_before_its_checkpoints(reported):
    run = reported.run
    report = (run / "evaluation" / "metrics.json").stat().st_mtime_ns
    assert report < (run / "checkpoints" / "last.ckpt").stat().st_mtime_ns


def test_a_figure_that_fails_to_draw_is_logged_and_the_run_still_finishes(
    make_config, tmp_path, monkeypatch, caplog
):
    def fail(*args):
        raise RuntimeError("out of colours")

    monkeypatch.setattr(validation_report, "plot_sample_predictions", fail)
    with caplog.at_level("ERROR", logger="segscale"):
        summary = train(make_config("trainer.max_epochs=1"))
    assert summary["status"] == "finished"
    png = tmp_path / "run" / "evaluation" / "sample_predictions.png"
    assert f"could not draw {png}: RuntimeError: out of colours" in caplog.text
    assert (tmp_path / "run" / "evaluation" / "confusion_matrix.png").is_file()


def test_confusion_cells_colour_bar_and_title_share_one_percent_unit():
    confusion = np.array([[3, 1, 0], [0, 0, 0], [0, 2, 2]])  # rows: true class
    figure = confusion_matrix_figure(confusion, ["a", "b", "c"], "Validation at iteration 9")
    axis, bar = figure.axes
    cells = [t.get_text() for t in axis.texts]
    assert cells == ["75.0", "25.0", "0.0", "–", "–", "–", "0.0", "50.0", "50.0"]
    assert axis.images[0].get_clim() == (0, 100)
    assert bar.get_ylabel() == CONFUSION_UNIT == "% of the true class's pixels"
    assert axis.get_title().startswith("Validation at iteration 9") and "%" in axis.get_title()
    assert (axis.get_xlabel(), axis.get_ylabel()) == ("Predicted class", "True class (its pixels)")
    assert [t.get_text() for t in axis.get_yticklabels()] == ["a (4 px)", "b (0 px)", "c (4 px)"]
