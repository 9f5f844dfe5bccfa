"""Preemption for real: a signal mid-epoch, a checkpoint at that step, exit 75, an exact resume.

The signal is real (the kernel delivers it, to one rank or to the whole process group
with its DDP ranks and DataLoader workers, as SLURM does); a test callback sends it
after a chosen step, so the test needs no timing. The resumed run must end with the
uninterrupted run's steps, learning rates and weights (float64).
"""

import json
import subprocess
from pathlib import Path

import pytest
import torch

from segscale.cli.train import main
from segscale.training.ranks.preemption import EXIT_PREEMPTED
from segscale.training.run.training_run import train
from tests.conftest import compose_config, tiny_overrides, train_command
from tests.helpers.in_process import run_in_process
from tests.helpers.process_group import assert_ended_in_time, run_in_own_group
from tests.helpers.record_batches import recorded

# 2 epochs of 4 steps of 4 patches (tiny_overrides' 2 tiles × 8 patches); float64 and no
# random geometry, so that two ranks with batch 2 take the same steps as one process with
# batch 4 (tests/cli/test_equivalence). A signal after step 5 comes mid-epoch. The same
# threads in every one-process run, with or without a DataLoader worker: a sum split
# over 1 or 2 threads rounds differently (5.6e-12 apart after 16 steps, measured).
EXACT = [
    "trainer.precision=64-true",
    "datamodule.augmentation.rotation=[0,0]",
    "datamodule.augmentation.translate_x=[0,0]",
    "datamodule.augmentation.translate_y=[0,0]",
    "+model.decoder_aspp_dropout=0.0",
    "callbacks.validation_report=null",
    "callbacks.training_progress=null",
    "training.threads=2",
    # At the default 0.03 the tiny runs' small network amplifies float64 rounding ~10x a
    # step (two ranks against one process: 7e-15 after step 1, 2e-4 after step 8); at
    # 0.003 the two stay within 1e-12, so a 1e-6 difference is a real one.
    "optimizer.lr=0.003",
]
STEPS = 8
DDP = ["strategy=ddp", "trainer.devices=2", "datamodule.batch_size=2", "training.threads=1"]
SIGNAL_AT = "+callbacks.signal._target_=tests.helpers.signal_at_step.SignalAtStep"


def run_result(run: Path) -> tuple[dict, dict[str, torch.Tensor], dict[int, float]]:
    """The summary, the final floating-point weights and the learning rate of each step."""
    summary = json.loads((run / "summary.json").read_text())
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    weights = {k: v for k, v in state["state_dict"].items() if v.is_floating_point()}
    lr = {}
    rows = (run / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    for row in rows[1:]:
        cells = dict(zip(header, row.split(","), strict=True))
        if cells.get("lr-SGD"):
            lr[int(cells["step"])] = float(cells["lr-SGD"])
    return summary, weights, lr


@pytest.fixture(scope="module")
def reference(tiny_data_root, tmp_path_factory) -> tuple[dict, dict, dict]:
    """One process, batch 4, never interrupted."""
    run = tmp_path_factory.mktemp("reference")
    train(compose_config("train", *tiny_overrides(tiny_data_root, run), *EXACT))
    return run_result(run)


def preempt(
    data_root: Path, run: Path, signal_overrides: list[str], *overrides: str
) -> subprocess.CompletedProcess:
    """Train in ``run`` until the signal stops it; every process must end in time.

    Within ``EXIT_S`` of the run's decision, by themselves (tests/helpers/process_group.py).
    """
    pids = run.parent / "pids"
    command = train_command(
        *tiny_overrides(data_root, None),
        *EXACT,
        *overrides,
        f"hydra.run.dir={run}",
        "ckpt_path=auto",
        SIGNAL_AT,
        f"+callbacks.signal.pid_dir={pids}",
        *signal_overrides,
    )
    stopped, gone = run_in_own_group(command, timeout_s=240)
    assert_ended_in_time(run, stopped, gone)
    return stopped


def resume(
    data_root: Path, run: Path, *overrides: str, own_process: bool = False
) -> subprocess.CompletedProcess:
    """Resume the run in ``run``: in this process (no 9 s of imports) unless ``own_process``.

    A DDP run needs its own: its rank 1 runs the program of ``__main__``.
    """
    args = [
        *tiny_overrides(data_root, None),
        *EXACT,
        *overrides,
        f"hydra.run.dir={run}",
        "ckpt_path=auto",
        # What this launch itself trains (assert_resumed_from): the final state alone
        # cannot tell a resume from a launch that retrained from step 0.
        "+callbacks.resumed._target_=tests.helpers.record_batches.RecordBatches",
        f"+callbacks.resumed.folder={run / 'resumed'}",
    ]
    if not own_process:
        return run_in_process(main, *args, cwd=run.parent)
    return subprocess.run(train_command(*args), capture_output=True, text=True, timeout=240)


def assert_preempted_at(run: Path, stopped: subprocess.CompletedProcess, step: int, name: str):
    assert stopped.returncode == EXIT_PREEMPTED, stopped.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["error"] is None
    assert summary["stop"]["signal"] == name and summary["stop"]["step"] == step
    assert summary["steps"] == step
    saved = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == step
    assert (
        f"preempted: {name} received; every rank stopped after step {step}"
        in (run / "train.log").read_text()
    )
    assert not list(run.rglob("*.tmp*")), "a temporary file was left behind"
    # The save asks Lightning for the whole state itself (no "defaulting to False" line).
    assert "weights_only" not in stopped.stdout + stopped.stderr


def assert_resumed_from(run: Path, step: int) -> None:
    """The resumed launch trained the steps after ``step`` and no other (rank 0's)."""
    batches, _ = recorded(run / "resumed")
    assert [batch["step"] for batch in batches] == list(range(step + 1, STEPS + 1))


def assert_resumed_as_reference(run: Path, reference, tolerance: float) -> None:
    summary, weights, lr = run_result(run)
    _, ref_weights, ref_lr = reference
    assert summary["status"] == "finished" and summary["steps"] == STEPS
    assert lr == pytest.approx(ref_lr, rel=1e-12)
    assert max((weights[k] - ref_weights[k]).abs().max().item() for k in ref_weights) < tolerance


@pytest.mark.slow
def test_a_signal_to_the_whole_process_group_saves_that_step_and_resumes_exactly(
    tiny_data_root, tmp_path, reference
):
    run = tmp_path / "run"
    # SIGTERM after step 5 to the process and its DataLoader worker, then 20 more
    # during the checkpoint's save.
    stopped = preempt(
        tiny_data_root,
        run,
        ["+callbacks.signal.step=5", "+callbacks.signal.group=true", "+callbacks.signal.repeat=20"],
        "datamodule.num_workers=1",
    )
    assert_preempted_at(run, stopped, 5, "SIGTERM")
    resumed = resume(tiny_data_root, run)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_resumed_from(run, 5)
    assert_resumed_as_reference(run, reference, tolerance=1e-12)


@pytest.mark.slow
def test_a_signal_to_one_ddp_rank_stops_both_at_one_step_and_resumes_exactly(
    tiny_data_root, tmp_path, reference
):
    run, pids = tmp_path / "run", tmp_path / "pids"
    ddp = DDP
    # SIGUSR2 (SLURM's warning under submitit) to rank 1 only, after step 5: rank 0
    # learns it from the agreement, and both stop after step 6.
    stopped = preempt(
        tiny_data_root,
        run,
        ["+callbacks.signal.step=5", "+callbacks.signal.name=SIGUSR2", "+callbacks.signal.rank=1"],
        *ddp,
    )
    assert_preempted_at(run, stopped, 6, "SIGUSR2")
    rank1 = int((pids / "rank1.pid").read_text())
    assert not Path(f"/proc/{rank1}").exists(), "rank 1 outlived rank 0"
    resumed = resume(tiny_data_root, run, *ddp, own_process=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_resumed_from(run, 6)
    # Two ranks with batch 2 are one process with batch 4, to float64's rounding.
    assert_resumed_as_reference(run, reference, tolerance=1e-6)


@pytest.mark.slow
def test_sigterm_to_rank_0_alone_stopping_on_an_epochs_last_step_ends_both_ranks_in_time(
    tiny_data_root, tmp_path
):
    # After step 3: the ranks agree after step 4, the last of epoch 0, and stop as its
    # validation starts, with a persistent worker per rank.
    run = tmp_path / "run"
    stopped = preempt(
        tiny_data_root, run, ["+callbacks.signal.step=3"], *DDP, "datamodule.num_workers=1"
    )
    assert_preempted_at(run, stopped, 4, "SIGTERM")


def validation_rows(run: Path) -> list[int]:
    """The step of each validation row of ``metrics.csv``."""
    rows = (run / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    cells = [dict(zip(header, row.split(","), strict=True)) for row in rows[1:]]
    return [int(c["step"]) for c in cells if c.get("val/mIoU")]


@pytest.mark.slow
def test_a_signal_during_a_long_validation_stops_in_it_and_the_resume_validates_it_again(
    tiny_data_root, tmp_path, reference
):
    run = tmp_path / "run"
    # SIGUSR2 at the first batch of the validation after step 4 (epoch 0's last), in a
    # validation of 9 batches that each take 1 s more: longer than the 3 s deadline,
    # which counts from the start of the stop, so the stop comes at a batch's end.
    stopped = preempt(
        tiny_data_root,
        run,
        [
            "+callbacks.signal.phase=validation",
            "+callbacks.signal.step=4",
            "+callbacks.signal.name=SIGUSR2",
            "+callbacks.signal.validation_sleep_s=1",
        ],
        "datamodule.val_batch_size=1",
        "training.preemption_deadline_s=3",
    )
    assert_preempted_at(run, stopped, 4, "SIGUSR2")
    signalled = float((run.parent / "pids" / "signal.time").read_text())
    assert (run / "summary.json").stat().st_mtime - signalled < 3
    log = (run / "train.log").read_text()
    assert "every rank stopped after step 4 (epoch 0), abandoning its validation at batch 0" in log
    assert validation_rows(run) == []  # the abandoned validation logged nothing

    resumed = resume(tiny_data_root, run, "datamodule.val_batch_size=1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_resumed_from(run, 4)
    assert_resumed_as_reference(run, reference, tolerance=1e-12)
    # Epoch 0's validation ran again, whole, before training went on; then epoch 1's.
    assert validation_rows(run) == [3, 7]


@pytest.mark.slow
def test_a_signal_to_one_ddp_rank_in_a_validation_of_uneven_shares_stops_both_in_it(
    tiny_data_root, tmp_path
):
    run, pids = tmp_path / "run", tmp_path / "pids"
    # 9 validation patches in batches of 2: rank 0 has 3 batches, rank 1 has 2; the
    # ranks agree at the batches both have. SIGTERM to rank 1 alone, at its first.
    stopped = preempt(
        tiny_data_root,
        run,
        [
            "+callbacks.signal.phase=validation",
            "+callbacks.signal.step=4",
            "+callbacks.signal.rank=1",
        ],
        *DDP,
        "datamodule.val_batch_size=2",
    )
    assert_preempted_at(run, stopped, 4, "SIGTERM")
    assert "abandoning its validation at batch 1" in (run / "train.log").read_text()
    rank1 = int((pids / "rank1.pid").read_text())
    assert not Path(f"/proc/{rank1}").exists(), "rank 1 outlived rank 0"


@pytest.mark.slow
def test_a_signal_before_training_ends_the_run_at_once_with_nothing_to_save(
    tiny_data_root, tmp_path
):
    run, pids = tmp_path / "run", tmp_path / "pids"
    command = train_command(
        *tiny_overrides(tiny_data_root, None),
        f"hydra.run.dir={run}",
        SIGNAL_AT,
        "+callbacks.signal.phase=setup",
        f"+callbacks.signal.pid_dir={pids}",
    )
    stopped, gone = run_in_own_group(command, timeout_s=240)
    assert stopped.returncode == EXIT_PREEMPTED, stopped.stderr[-3000:]
    assert gone - float((pids / "signal.time").read_text()) < 5
    log = (run / "train.log").read_text()
    assert "SIGTERM received before training started: nothing to save yet" in log
    assert "exiting now" not in stopped.stderr  # the run ended itself, not its deadline
    # A launch that never trained leaves no checkpoint and no summary of its own.
    assert not (run / "checkpoints" / "last.ckpt").exists()
    assert not (run / "summary.json").exists()
