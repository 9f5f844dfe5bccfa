"""One validation number: train.py's val/mIoU is what ``evaluate.py split=val`` gives.

One tiny training (through train.py's entry point) serves the tests of this file; its
patch size (80) does not divide the validation tiles (192), so the validation grid's
last row and column are moved back inside the tile, as in real data. It trains long
enough (64 patches per image) for its network to predict more than one class and to
depend on a pixel's context: an inference other than validation's (predict.py's
overlapping blended tiles, or a blend in the grid's overlap) then scores hundreds of
pixels differently, where the network of a shorter run predicts one class everywhere
whatever the tiles.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from segscale.cli.evaluate import main as evaluate_main
from segscale.cli.train import main as train_main
from tests.conftest import tiny_overrides
from tests.helpers.in_process import run_in_process

PATCH = 80


@pytest.fixture(scope="module")
def trained_run(tiny_data_root: Path, tmp_path_factory: pytest.TempPathFactory):
    """A finished tiny run: its folder and what train.py wrote on stdout and stderr."""
    run = tmp_path_factory.mktemp("validated") / "run"
    done = run_in_process(
        train_main,
        *tiny_overrides(tiny_data_root, run),
        f"datamodule.patch_size={PATCH}",
        "datamodule.patches_per_image=64",
        "trainer.max_epochs=1",  # one validation is the number compared
        "callbacks.verbose_log.frequency=2",
        f"hydra.run.dir={run}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return run, done


def confusion(folder: Path) -> np.ndarray:
    """``confusion_matrix.csv`` of an evaluation folder: rows true, columns predicted."""
    with (folder / "confusion_matrix.csv").open(newline="") as file:
        rows = list(csv.reader(file))[1:]
    return np.array([[int(count) for count in row[1:]] for row in rows])


@pytest.mark.slow
def test_evaluate_split_val_gives_the_validation_miou_of_training(trained_run, tmp_path: Path):
    run, _ = trained_run
    summary = json.loads((run / "summary.json").read_text())
    out = tmp_path / "evaluated"
    done = run_in_process(
        evaluate_main,
        f"ckpt={summary['best_checkpoint']}",
        "split=val",
        "accelerator=cpu",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
        program="evaluate.py",
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["MeanIoU"] == pytest.approx(summary["best_score"], abs=1e-3)
    # Pixel by pixel: the run's own report of this checkpoint (its last validation) and
    # evaluate.py's count the same predictions, but for near-ties that a different
    # batching may flip. Its network predicts several classes, so tiles cut or blended
    # otherwise would move hundreds of pixels.
    validated, evaluated = confusion(run / "evaluation"), confusion(out)
    assert np.count_nonzero(validated.sum(axis=0)) >= 2  # classes predicted
    moved = np.abs(validated - evaluated).sum() // 2  # a pixel leaves one cell, joins one
    assert moved <= validated.sum() / 1000
    # Each number says which inference made it: the same one here.
    grid = {"tile_size": PATCH, "overlap": 0.0, "blend": "none"}
    assert summary["validation_inference"] == grid
    assert metrics["inference"] == grid | {"tta": "none", "tta_scales": [1.0]}
    # The log names the folder and shows the classes' scores.
    assert f"evaluation written to {out}" in output
    assert "class" in output and "IoU" in output
    rows = [line.split() for line in output.splitlines()]
    assert all(
        # name, Accuracy, IoU, Dice, MeanBFScore
        any(row[:1] == [name] and len(row) == 5 for row in rows)
        for name in metrics["classes"]
    )


@pytest.mark.slow
def test_evaluate_with_predict_s_inference_says_so(trained_run, tmp_path: Path):
    run, _ = trained_run
    out = tmp_path / "evaluated"
    done = run_in_process(
        evaluate_main,
        f"ckpt={run / 'checkpoints/best.ckpt'}",
        "inference=default",
        "accelerator=cpu",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
        program="evaluate.py",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["inference"] == {
        "tile_size": 512,
        "overlap": 0.25,
        "blend": "gaussian",
        "tta": "none",
        "tta_scales": [1.0],
    }


@pytest.mark.slow
def test_a_redirected_training_log_has_rows_and_no_progress_bar(trained_run):
    _, done = trained_run  # its stdout and stderr were not a terminal
    output = done.stdout + done.stderr
    assert "it/s]" not in output and "\r" not in output
    assert "| Epoch | Iteration |" in output
