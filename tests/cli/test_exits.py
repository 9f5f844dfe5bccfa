"""Every way a run ends ends every process of it within seconds: finished, failed, interrupted.

Through ``python train.py`` with a DataLoader worker that persists across epochs, since
workers were what outlived a run. Preempted runs (a signal to the whole group, to one
DDP rank, to rank 0 alone) are in tests/cli/test_preemption.py, with the same check.
"""

import json

import pytest

from tests.cli.test_preemption import SIGNAL_AT
from tests.conftest import tiny_overrides, train_command
from tests.helpers.process_group import assert_ended_in_time, run_in_own_group

WORKER = ["datamodule.num_workers=1", "datamodule.persistent_workers=true"]


def run_to_its_end(data_root, run, *overrides: str):
    """``python train.py`` in ``run`` with one persistent worker; checked to end in time."""
    command = train_command(
        *tiny_overrides(data_root, None), *WORKER, *overrides, f"hydra.run.dir={run}"
    )
    done, gone = run_in_own_group(command, timeout_s=120)
    assert_ended_in_time(run, done, gone)
    return done, json.loads((run / "summary.json").read_text())


@pytest.mark.slow
def test_a_failure_during_validation_with_persistent_workers_ends_every_process(
    tiny_data_root, tmp_path
):
    # One step (8 patches, batch 8) with a learning rate that makes the validation loss
    # NaN: the run failed in validation while the training loader's worker was alive.
    run = tmp_path / "run"
    done, summary = run_to_its_end(
        tiny_data_root,
        run,
        "datamodule.patches_per_image=4",
        "datamodule.batch_size=8",
        "trainer.max_epochs=1",
        "optimizer.lr=1e6",
    )
    assert done.returncode == 3, done.stderr[-3000:]
    assert summary["status"] == "failed"
    log = (run / "train.log").read_text()
    assert "the validation loss is not finite" in log
    # The rate the step trained at, not the 0 the poly schedule holds after its last step.
    assert "a learning rate too high for this model and batch (up to 1e+06 in the steps" in log


@pytest.mark.slow
def test_a_finished_run_with_workers_ends_every_process(tiny_data_root, tmp_path):
    run = tmp_path / "run"
    done, summary = run_to_its_end(tiny_data_root, run, "trainer.max_epochs=1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary["status"] == "finished"


@pytest.mark.slow
def test_an_interrupted_run_ends_every_process(tiny_data_root, tmp_path):
    # Ctrl-C in a terminal: SIGINT to the foreground process group, workers included.
    run = tmp_path / "run"
    done, summary = run_to_its_end(
        tiny_data_root,
        run,
        SIGNAL_AT,
        "+callbacks.signal.step=2",
        "+callbacks.signal.name=SIGINT",
        "+callbacks.signal.group=true",
    )
    assert done.returncode != 0
    assert summary["status"] == "failed" and "KeyboardInterrupt" in summary["error"]
