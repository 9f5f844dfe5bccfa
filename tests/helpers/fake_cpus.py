"""A process's CPU limits faked: its cgroups (with their quotas), its mask, its launcher."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from segscale.platforms import cores

LAUNCHER_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_CPUS_PER_TASK")


def fake_cgroups(
    monkeypatch: pytest.MonkeyPatch, root: Path, membership: str, files: dict[str, str]
) -> None:
    """This process in the cgroups ``membership`` names (``/proc/self/cgroup``'s lines).

    ``files`` maps paths under the cgroup mount ``root`` to their text, e.g.
    ``{"kubepods/pod1/cpu.max": "200000 100000"}``.
    """
    root.mkdir(parents=True, exist_ok=True)
    (root / "membership").write_text(membership)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(cores, "CGROUP_MEMBERSHIP", root / "membership")
    monkeypatch.setattr(cores, "CGROUP_ROOT", root)


def fake_mask(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """This process's affinity mask holds ``count`` cores of a 64-core machine."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(cores, "affinity", lambda: set(range(count)))


def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """No torchrun, SLURM or segscale launcher started this process."""
    for variable in LAUNCHER_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def slurm_task(
    monkeypatch: pytest.MonkeyPatch, local_id: int, tasks: int, cpus: str | None
) -> None:
    """This process is task ``local_id`` of ``tasks`` that srun started (``--cpus-per-task``)."""
    no_launcher(monkeypatch)
    monkeypatch.setenv("SLURM_LOCALID", str(local_id))
    monkeypatch.setenv("SLURM_NTASKS", str(tasks))
    if cpus is not None:
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", cpus)
