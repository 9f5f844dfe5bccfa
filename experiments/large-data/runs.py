"""One ``train.py`` run of a source tree, its processes' memory sampled every 0.5 s.

The memory of a run is summed over its processes (the launched ``train.py``, the rank it
starts, their DataLoader workers: every descendant) from ``/proc/<pid>/smaps_rollup``:
``Pss`` (resident memory, shared pages divided among the processes that map them) and
``Pss_Anon`` (its anonymous part: the run's private memory, which no other process and
no page cache can give back). The peak is the largest sum of one sample. A ``cap``
stops the run (SIGKILL to its process group) once its PSS passes it: the in-memory path
on a dataset larger than memory is stopped there, before it takes the machine's memory
from everyone else on it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SAMPLE_S = 0.5


def children(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += parents.get(current, [])
    return found


def pss(pid: int) -> tuple[int, int]:
    """``Pss`` and ``Pss_Anon`` of one process, in bytes (0, 0 when it is gone)."""
    values = {"Pss:": 0, "Pss_Anon:": 0}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, *rest = line.split()
            if name in values:
                values[name] = int(rest[0]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return values["Pss:"], values["Pss_Anon:"]


class MemorySampler(threading.Thread):
    """Samples a process tree every ``SAMPLE_S``; keeps the peaks; kills past ``cap``."""

    def __init__(self, process: subprocess.Popen, cap: int | None) -> None:
        super().__init__(daemon=True)
        self.process, self.cap = process, cap
        self.peak_pss = self.peak_private = self.peak_processes = 0
        self.killed_at: dict[str, float] | None = None
        self.start_time = time.perf_counter()
        self.samples: list[tuple[float, int, int]] = []  # seconds, PSS, private

    def peaks_until(self, seconds: float) -> tuple[int, int]:
        """The peak PSS and private memory of the samples in the first ``seconds``."""
        early = [(p, a) for t, p, a in self.samples if t <= seconds] or [(0, 0)]
        return max(p for p, _ in early), max(a for _, a in early)

    def run(self) -> None:
        """Sample until the process ends."""
        while self.process.poll() is None:
            pids = children(self.process.pid)
            total = [sum(values) for values in zip(*(pss(p) for p in pids), strict=True)]
            self.peak_pss = max(self.peak_pss, total[0])
            self.peak_private = max(self.peak_private, total[1])
            self.peak_processes = max(self.peak_processes, len(pids))
            self.samples.append((time.perf_counter() - self.start_time, total[0], total[1]))
            if self.cap and total[0] > self.cap and self.killed_at is None:
                self.killed_at = {"s": time.perf_counter() - self.start_time, "pss": total[0]}
                os.killpg(self.process.pid, signal.SIGKILL)
            time.sleep(SAMPLE_S)


def train(
    tree: Path,
    data: Path,
    out: Path,
    overrides: list[str],
    cache: Path,
    cap: int | None = None,
) -> dict[str, Any]:
    """Run ``tree``'s ``train.py`` on ``data`` (2 CPU ranks, one epoch) into ``out``.

    ``cache`` is the user cache folder (``XDG_CACHE_HOME``: the validation pass's cache
    and the decode cache). Returns the exit status, wall time, peak memory and what
    ``summary.json`` says of the start-up and the rate.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        str(tree / "train.py"),
        "datamodule=folder",
        f"datamodule.source.root={data}",
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=2",
        "training.threads=1",
        f"output_dir={out}",
        f"hydra.run.dir={out}",
        *overrides,
    ]
    env = os.environ | {"PYTHONPATH": str(tree / "src"), "XDG_CACHE_HOME": str(cache)}
    log = out.with_name(out.name + ".log")
    started = time.perf_counter()
    with log.open("w") as stream:
        process = subprocess.Popen(
            command,
            cwd=tree,
            env=env,
            stdout=stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        sampler = MemorySampler(process, cap)
        sampler.start()
        code = process.wait()
        sampler.join()
    summary_file = out / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    split = summary.get("time_split_s") or {}
    trained = sum(split.get(k, 0.0) for k in ("startup", "training", "validation"))
    training_peaks = sampler.peaks_until(trained) if split else (0, 0)
    return {
        "tree": tree.name,
        "exit": code,
        "wall_s": round(time.perf_counter() - started, 1),
        "peak_pss_gb": round(sampler.peak_pss / 1e9, 3),
        "peak_private_gb": round(sampler.peak_private / 1e9, 3),
        "training_peak_pss_gb": round(training_peaks[0] / 1e9, 3),
        "training_peak_private_gb": round(training_peaks[1] / 1e9, 3),
        "processes": sampler.peak_processes,
        "killed_at": sampler.killed_at,
        "time_to_first_step_s": summary.get("time_to_first_step_s"),
        "startup_phases_s": summary.get("startup_phases_s"),
        "steady_patches_per_s": summary.get("steady_patches_per_s"),
        "steps": summary.get("steps"),
        "train_patches": summary.get("train_patches"),
        "throughput_patches_per_s": summary.get("throughput_patches_per_s"),
        "log": str(log),
        "overrides": overrides,
    }


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages now."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
