"""A preemption signal inside a gradient-accumulation window stops the run after the
window's optimizer step, so that the resumed run trains each batch once, in its window.

The preempted run is a process of its own in a process group of its own (the signal is
real); the resume runs train.py's entry point in this process. ``RecordBatches``
records both launches. Both have a DataLoader worker, as a run has by default
(``num_workers: auto``). The signal is Ctrl-C as Windows takes it: ``SIGINT`` (one of
Windows' default preemption signals, with Ctrl-Break's ``SIGBREAK``, which Linux lacks)
to every process of the group, as a console sends it to every process attached to it.
"""

import json

import pytest

from segscale.cli.train import main
from tests.cli.test_preemption import assert_preempted_at
from tests.conftest import tiny_overrides, train_command
from tests.helpers.in_process import run_in_process
from tests.helpers.process_group import assert_ended_in_time, run_in_own_group
from tests.helpers.record_batches import recorded

# 2 tiles × 5 patches in batches of 2: one epoch of 5 batches in windows of 2 (3 steps).
WINDOWS = [
    "datamodule.patches_per_image=5",
    "datamodule.batch_size=2",
    "datamodule.patch_size=32",
    "trainer.accumulate_grad_batches=2",
    "trainer.max_epochs=1",
    "datamodule.num_workers=1",
    "callbacks.validation_report=null",
    "callbacks.training_progress=null",
    "+callbacks.record._target_=tests.helpers.record_batches.RecordBatches",
]


@pytest.mark.slow
def test_a_signal_inside_an_accumulation_window_stops_after_its_step(tiny_data_root, tmp_path):
    run = tmp_path / "run"
    args = [
        *tiny_overrides(tiny_data_root, None),
        *WINDOWS,
        f"+callbacks.record.folder={tmp_path}/record",
        f"hydra.run.dir={run}",
        "ckpt_path=auto",
    ]
    # Ctrl-C (SIGINT to the whole group) after batch 0, the first of the first window
    # (global step 0).
    signal_at = [
        "training.preemption_signals=[SIGINT]",
        "+callbacks.signal._target_=tests.helpers.signal_at_step.SignalAtStep",
        "+callbacks.signal.step=0",
        "+callbacks.signal.name=SIGINT",
        "+callbacks.signal.group=true",
    ]
    stopped, gone = run_in_own_group(train_command(*args, *signal_at), timeout_s=300)
    assert_ended_in_time(run, stopped, gone)  # the worker, which ignored it, included
    # After the window's step, not inside the window: last.ckpt holds step 1.
    assert_preempted_at(run, stopped, 1, "SIGINT")
    resumed = run_in_process(main, *args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    batches, _ = recorded(tmp_path / "record")
    assert [b["batch"] for b in batches] == [0, 1, 2, 3, 4]
    assert [b["step"] for b in batches] == [0, 1, 1, 2, 3]  # windows of 2, then of 1
    patches = [tuple(key) for b in batches for key in b["keys"]]
    assert len(patches) == len(set(patches)) == 10  # each patch of the epoch once
    assert json.loads((run / "summary.json").read_text())["steps"] == 3
