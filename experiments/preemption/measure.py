"""Steps lost per preemption: a signal after step 13 of a run of 8-step epochs, then resume.

    python experiments/preemption/measure.py [--out FILE --label NAME] OUT_FOLDER [REPO] \
        [train.py overrides ...]
    python experiments/preemption/measure.py --table FILE

trains the tests' tiny synthetic tiles (generated into OUT_FOLDER/data) for 3 epochs of
8 steps with the shipped checkpoint settings (``last.ckpt`` and ``best.ckpt`` at each
validation, no periodic checkpoint), sends SIGTERM to the run's process group after
step 13 (``tests/helpers/signal_at_step.py``; ``GROUP=false`` sends it to rank 0
only), and prints one JSON line: the exit status, the seconds until every process was
gone, the checkpoints and their steps, the summary's status, and the steps a
``ckpt_path=auto`` resume would train again. With ``--out`` the record (with ``--label``,
the commit of ``REPO`` and the overrides) is added to the runs of that JSON file, and
``--table`` prints a stored file's runs as the README's table. ``REPO`` (default: this
checkout) is the checkout whose ``train.py`` runs, e.g. a ``git worktree`` of an older
commit; run it with ``PYTHONPATH=<REPO>/src:<REPO>`` so that its own package is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

SIGNAL_AFTER_STEP = 13


def train_until_signal(out: Path, repo: Path, extra: list[str]) -> dict[str, Any]:
    """Run train.py of ``repo`` until the signal; what a resume would train again."""
    sys.path.insert(0, str(repo))
    from tests.conftest import tiny_overrides

    from segscale.data.datasets.synthetic import SyntheticTiles

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
        "+callbacks.signal._target_=tests.helpers.signal_at_step.SignalAtStep",
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
    return {
        "signal_to": "process group" if group == "true" else "rank 0 only",
        "exit": status,
        "seconds": round(seconds, 1),
        "checkpoints": steps,
        "summary_status": summary.get("status"),
        "signal_after_step": SIGNAL_AFTER_STEP,
        "resume_from_step": resumed_from,
        "steps_trained_again": max(0, SIGNAL_AFTER_STEP - resumed_from),
    }


def commit_of(repo: Path) -> str:
    """The short commit of ``repo``, with ``+changes`` when its run's code differs from it.

    Only what the run executes counts (``src``, ``train.py``, tracked ``tests``).
    """
    git = ["git", "-C", str(repo)]
    commit = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no", "--", "src", "train.py", "tests"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return commit + ("+changes" if dirty else "")


def add_record(file: Path, record: dict[str, Any]) -> None:
    """Append ``record`` to the runs of ``file`` (created when missing), atomically."""
    from segscale.atomic_files import write_text_atomically

    stored = json.loads(file.read_text()) if file.exists() else {"runs": []}
    stored["runs"].append(record)
    write_text_atomically(file, json.dumps(stored, indent=2) + "\n")


def table(stored: dict[str, Any]) -> str:
    """The README's table: one row per stored run, in the order they ran."""
    lines = [
        "| run | signal to | code | exit | newest checkpoint | summary | trained again |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in stored["runs"]:
        # last.ckpt names the newest when best.ckpt was saved at the same step.
        newest = max(
            run["checkpoints"].items(),
            key=lambda item: (item[1], item[0] == "last.ckpt"),
            default=None,
        )
        checkpoint = f"step {newest[1]} (`{newest[0]}`)" if newest else "none"
        lines.append(
            f"| {run['label']} | {run['signal_to']} | {run['code']} | {run['exit']} | "
            f"{checkpoint} | {run['summary_status']} | **{run['steps_trained_again']}** |"
        )
    return "\n".join(lines)


def main() -> None:
    """Train until the signal and print (and with ``--out`` store) the record."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="JSON file whose runs get this record")
    parser.add_argument("--label", default="", help="the run's name in the table")
    parser.add_argument("--table", type=Path, help="print this stored file's table; run nothing")
    parser.add_argument("folder", type=Path, nargs="?")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    if args.folder is None:
        parser.error("OUT_FOLDER is required unless --table is given")
    rest = args.rest
    has_repo = bool(rest) and "=" not in rest[0]
    repo = Path(rest[0]).resolve() if has_repo else Path(__file__).resolve().parents[2]
    extra = rest[1:] if has_repo else rest
    record = train_until_signal(args.folder.resolve(), repo, extra)
    print(json.dumps(record))
    if args.out:
        record = {
            "label": args.label,
            "code": commit_of(repo),
            "overrides": extra,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_average_1min": round(os.getloadavg()[0], 2),
            **record,
        }
        add_record(args.out, record)


if __name__ == "__main__":
    main()
