"""Steps lost per preemption: a signal after step 13 of a run of 8-step epochs, then resume.

    python experiments/preemption/measure.py OUT_FOLDER [REPO] [train.py overrides ...]

trains the tests' tiny synthetic tiles (generated into OUT_FOLDER/data) for 3 epochs of
8 steps with the shipped checkpoint settings (``last.ckpt`` and ``best.ckpt`` at each
validation, no periodic checkpoint), sends SIGTERM to the run's process group after
step 13 (``tests/training/signal_at_step.py``; ``GROUP=false`` sends it to rank 0
only), and prints one JSON line: the exit status, the seconds until every process was
gone, the checkpoints and their steps, the summary's status, and the steps a
``ckpt_path=auto`` resume would train again. ``REPO`` (default: this checkout) is the
checkout whose ``train.py`` runs, e.g. a ``git worktree`` of an older commit; run it
with ``PYTHONPATH=<REPO>/src:<REPO>`` so that its own package is imported.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

SIGNAL_AFTER_STEP = 13


def main() -> None:
    """Train until the signal, then print what a resume would train again."""
    out = Path(sys.argv[1]).resolve()
    has_repo = len(sys.argv) > 2 and "=" not in sys.argv[2]
    repo = Path(sys.argv[2]).resolve() if has_repo else Path(__file__).resolve().parents[2]
    extra = sys.argv[3:] if has_repo else sys.argv[2:]
    sys.path.insert(0, str(repo))
    from tests.conftest import tiny_overrides

    from segscale.data.synthetic import SyntheticTiles

    data = out / "data"
    if not data.exists():
        SyntheticTiles(root=str(data), num_train=2, num_val=1, image_size=192, seed=0).prepare()
    run = out / f"run-{time.strftime('%H%M%S')}"
    group = os.environ.get("GROUP", "true")
    command = [
        sys.executable,
        str(repo / "train.py"),
        *tiny_overrides(data, None),
        "datamodule.patches_per_image=16",
        "trainer.max_epochs=3",
        f"hydra.run.dir={run}",
        "ckpt_path=auto",
        "+callbacks.signal._target_=tests.training.signal_at_step.SignalAtStep",
        f"+callbacks.signal.step={SIGNAL_AFTER_STEP}",
        f"+callbacks.signal.group={group}",
        *extra,
    ]
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=repo,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        status: int | str = process.wait(timeout=300)
    except subprocess.TimeoutExpired:
        status = "still running after 300 s: killed"
        os.killpg(process.pid, signal.SIGKILL)
    seconds = time.monotonic() - started
    steps = {
        path.name: int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])
        for path in sorted((run / "checkpoints").glob("*.ckpt"))
    }
    summary_file = run / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    resumed_from = max(steps.values(), default=0)
    print(
        json.dumps(
            {
                "exit": status,
                "seconds": round(seconds, 1),
                "checkpoints": steps,
                "summary_status": summary.get("status"),
                "signal_after_step": SIGNAL_AFTER_STEP,
                "resume_from_step": resumed_from,
                "steps_trained_again": max(0, SIGNAL_AFTER_STEP - resumed_from),
            }
        )
    )


if __name__ == "__main__":
    main()
