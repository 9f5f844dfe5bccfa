"""A write that meets a full disk ends train.py, predict.py and evaluate.py in a few lines.

The disk fills for the files the test names: their writes raise ``ENOSPC`` as a full
disk makes them (the atomic writer's stream, PIL's file), in runs of the entry points
in this process.
"""

import errno
import os
from pathlib import Path

import pytest
from PIL import Image

from segscale import atomic_files
from segscale.cli.evaluate import main as evaluate_main
from segscale.cli.predict import main as predict_main
from segscale.cli.train import main as train_main
from segscale.errors import EXIT_DISK_FULL
from tests.cli.test_predict import _images
from tests.conftest import oracle_checkpoint, tiny_overrides
from tests.helpers.in_process import run_in_process

NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FullDiskFile:
    """A file opened for writing on a full disk: every write fails."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str):
        return getattr(self.stream, name)

    def __enter__(self) -> "FullDiskFile":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stream.close()


def fill_disk_for(monkeypatch, marker: str) -> None:
    """The atomic writer's files whose name holds ``marker`` meet a full disk."""

    def full_open(path, mode="r", *args, **kwargs):
        stream = open(path, mode, *args, **kwargs)  # noqa: SIM115 (closed by its with)
        return FullDiskFile(stream) if marker in Path(path).name else stream

    monkeypatch.setattr(atomic_files, "open", full_open, raising=False)


def assert_few_lines(done, *expected: str) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == EXIT_DISK_FULL, output[-3000:]
    assert "Traceback" not in output
    error = output[max(0, output.index("could not be written") - 300) :]
    for text in expected:
        assert text in error, error


@pytest.mark.slow
def test_a_training_run_whose_checkpoint_meets_a_full_disk_ends_in_a_few_lines(
    tiny_data_root, tmp_path, monkeypatch
):
    run = tmp_path / "run"
    fill_disk_for(monkeypatch, ".ckpt")
    done = run_in_process(
        train_main,
        *tiny_overrides(tiny_data_root, None),
        "trainer.max_epochs=1",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert_few_lines(
        done,
        f"{run / 'checkpoints' / 'best.ckpt'} could not be written: no space left on device",
        f"the output folder: {run}",
        "ckpt_path=auto",
    )
    assert not list((run / "checkpoints").glob("*"))  # no half checkpoint, no temporary


def test_a_prediction_whose_mask_meets_a_full_disk_ends_in_a_few_lines(tmp_path, monkeypatch):
    _images(tmp_path / "in")

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Image.Image, "save", full_disk)
    out = tmp_path / "out"
    done = run_in_process(
        predict_main,
        f"ckpt={oracle_checkpoint(tmp_path / 'oracle.ckpt')}",
        f"input={tmp_path / 'in'}",
        f"hydra.run.dir={out}",
        "accelerator=cpu",
        "inference.tile_size=32",
        cwd=tmp_path,
        program="predict.py",
    )
    assert_few_lines(done, f"{out / 'tall.png'} could not be written", f"the output folder: {out}")


def test_an_evaluation_whose_report_meets_a_full_disk_ends_in_a_few_lines(tmp_path, monkeypatch):
    from tests.cli.test_evaluate import _dataset

    root = _dataset(tmp_path / "data")
    fill_disk_for(monkeypatch, "metrics.json")
    out = tmp_path / "out"
    done = run_in_process(
        evaluate_main,
        f"ckpt={oracle_checkpoint(tmp_path / 'oracle.ckpt')}",
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "other_data=true",  # not the oracle's
        "split=test",
        "accelerator=cpu",
        "inference.tile_size=32",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
        program="evaluate.py",
    )
    assert_few_lines(done, f"{out / 'metrics.json'} could not be written: no space left")


@pytest.mark.slow
def test_a_full_disk_stops_a_grid_sweep_at_once(tiny_data_root, tmp_path, monkeypatch):
    from tests.cli.test_sweeps import job_folders, multirun

    fill_disk_for(monkeypatch, ".ckpt")
    sweep, done = multirun(tmp_path, tiny_data_root, "optimizer.lr=0.01,0.03")
    assert_few_lines(done, f"{sweep / '0' / 'checkpoints' / 'best.ckpt'} could not be written")
    assert job_folders(sweep) == ["0"]  # the next job would have met the same disk
    assert (sweep / "sweep_summary.md").is_file()


def test_a_sweep_summary_on_a_full_disk_is_said_in_a_line(tmp_path, monkeypatch, caplog):
    from hydra_plugins.segscale_plugins import grid_sweeper

    (tmp_path / "0").mkdir()

    def full_disk(folder):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "sweep_summary.csv"))

    monkeypatch.setattr(grid_sweeper, "write_sweep_summary", full_disk)
    grid_sweeper.summarize(tmp_path)
    assert caplog.messages == [
        f"the sweep summary was not written: [Errno 28] No space left on device: "
        f"'{tmp_path / 'sweep_summary.csv'}'"
    ]
