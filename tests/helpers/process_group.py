"""A command run in a process group of its own, and a check that all of it ends in time.

The command starts in a session of its own, so its process group holds its processes
alone: the program, the DDP ranks it starts and every rank's DataLoader workers. The
run's decision to exit is the moment it writes ``summary.json`` (finished, failed,
preempted or interrupted alike); every process must be gone within ``EXIT_S`` of it,
and the emergency deadline of ``segscale.training.ranks.preemption`` must not be what ended
any of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

EXIT_S = 10.0
"""Seconds from a run's decision to exit until every process of it must be gone."""

LATE_EXIT = "; exiting now"
"""Part of the line a process writes when the emergency deadline ends it."""


def run_in_own_group(
    command: list[str], timeout_s: float = 240
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``command``; return its result and the time its last process was gone.

    A run that does not end within ``timeout_s`` (output closed by every process that
    holds it, workers included) has its whole group killed, and the test fails.
    """
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_interruptible,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    finally:
        if group_alive(process.pid) or process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    while group_alive(process.pid):  # members that closed their output but still run
        time.sleep(0.05)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), time.time()


def _interruptible() -> None:
    """SIGINT at its default in the started group, as in a terminal's foreground job.

    A shell starts its background jobs with SIGINT ignored, and processes inherit that:
    a suite started with ``… &`` would otherwise start runs that Ctrl-C cannot reach.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def group_alive(group: int) -> bool:
    """Whether any process of the process group ``group`` is alive (zombies count)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def assert_ended_in_time(run: Path, done: subprocess.CompletedProcess[str], gone: float) -> None:
    """Every process of the run in ``run`` was gone within ``EXIT_S`` of its decision."""
    decided = (run / "summary.json").stat().st_mtime
    output = done.stdout + done.stderr + (run / "train.log").read_text()
    assert LATE_EXIT not in output, "the emergency deadline ended a process"
    assert gone - decided < EXIT_S, f"processes of the run lived {gone - decided:.1f} s on"
