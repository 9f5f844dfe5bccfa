"""What differs in processes: age, memory (peak, freed kept), ending one, a child's interrupt.

- Age: Linux says when a process started in clock ticks since boot (``/proc/self/stat``,
  read against ``CLOCK_BOOTTIME``: exact to a tick); elsewhere psutil's start time
  (macOS and Windows keep it to the microsecond; psutil's on Linux only to the second,
  as it adds the boot time in whole seconds).
- Peak memory: ``getrusage``'s ``ru_maxrss`` on POSIX systems, in KiB on Linux and in
  bytes on macOS; the peak working set (psutil) on Windows.
- Ending this process, or another and all it started, at once: psutil's ``kill``
  (``SIGKILL``; ``TerminateProcess`` on Windows).
- A child interrupted alone: ``SIGINT`` on POSIX systems; on Windows a console event,
  which reaches a child only in a process group of its own (``CTRL_BREAK_EVENT``:
  Windows cannot send Ctrl-C to a group), which the child hears as ``SIGBREAK``.
- Workers that end with their parent: Linux's ``prctl(PR_SET_PDEATHSIG)``.
- Freed memory kept for reuse (``keep_freed_memory``): glibc (Linux) hands freed memory
  back after every step. A CPU training step allocates and frees the same large tensors
  every step (activations, their gradients). glibc's ``malloc`` serves those above its
  mmap threshold with fresh ``mmap`` pages and returns the top of its heap once more
  than its trim threshold lies free there; its dynamic threshold (raised to the largest
  block freed, at most 32 MiB) depends on what the process freed first. So one
  process's step page-faults twice as often as another's doing the same work:
  DeepLabV3+ ResNet-18 on 8 patches of 256² took 43-107k minor faults a step with
  glibc's defaults and ~0 with both thresholds set, and 5-10% less time (issue 49).
  PyTorch leaves CPU allocation to the C library (pytorch/pytorch#55675 and #53715
  discuss a caching allocator of its own, never made the default); Intel's CPU guides
  preload jemalloc or tcmalloc instead, which a pip install cannot do.
  ``keep_freed_memory`` sets glibc's two thresholds for this process (``mallopt``) and,
  through the environment variables glibc reads when a process starts, for the
  processes it starts (DDP ranks, spawned workers). Nowhere else is anything done:
  macOS's and Windows' allocators keep freed blocks themselves, and musl has no such
  settings.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

PR_SET_PDEATHSIG = 1
"""``prctl(2)`` option: the signal the kernel sends a process when its parent exits."""


def process_age() -> float | None:
    """Seconds since this process started; ``None`` where the system does not say."""
    if sys.platform.startswith("linux"):
        return _linux_process_age()
    try:
        started = psutil.Process().create_time()
    except psutil.Error:
        return None
    return max(0.0, time.time() - started)


def _linux_process_age() -> float | None:
    if not sys.platform.startswith("linux"):  # for the type checker: names Linux alone has
        return None
    try:
        stat = Path("/proc/self/stat").read_text(encoding="utf-8")
        # Field 22, starttime, in clock ticks since boot; fields after the command's ")".
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        ticks_per_s = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):  # no /proc (a container without it)
        return None
    return max(0.0, since_boot - ticks / ticks_per_s)


def peak_memory_bytes() -> int:
    """The most memory this process has held resident (its peak RSS), in bytes."""
    if sys.platform == "win32":
        return int(psutil.Process().memory_info().peak_wset)
    import resource  # POSIX only

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes, Linux KiB


def end_this_process() -> None:
    """End this process at once, from any thread: no handler, no clean-up, no waiting."""
    psutil.Process().kill()


def end_process_tree(pid: int) -> None:
    """End process ``pid`` and every process it started, at once, on every platform.

    Its descendants are listed first (ended, a process's children would be adopted by
    the system and no longer be found), then all are killed (``SIGKILL``;
    ``TerminateProcess`` on Windows); one already gone is passed over.
    """
    try:
        root = psutil.Process(pid)
        tree = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(tree, timeout=10)


def interruptible_child() -> dict[str, Any]:
    """``subprocess.Popen`` arguments for a child that ``interrupt`` can reach alone."""
    if sys.platform == "win32":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {}


def interrupt(child: subprocess.Popen[Any]) -> None:
    """Interrupt ``child`` (started with ``interruptible_child``) as Ctrl-C would, or Ctrl-Break."""
    if sys.platform == "win32":
        child.send_signal(signal.CTRL_BREAK_EVENT)
    else:
        child.send_signal(signal.SIGINT)


def end_with_parent() -> None:
    """Have the kernel kill this process as soon as its parent is gone (Linux only).

    "Parent" is the thread that started this process. Elsewhere nothing is done: a
    DataLoader worker then notices a parent gone in its idle check, every 5 s.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


MMAP_THRESHOLD = 256 * 2**20
"""Blocks below this come from the heap and are reused; glibc's default starts at 128 KiB."""
TRIM_THRESHOLD = 2**30
"""Free memory at the top of the heap is handed back to the system above this (default 128 KiB)."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
VARIABLES = {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD}
"""What glibc reads at a process's start for the same settings (its tunables' aliases)."""


def keep_freed_memory() -> str:
    """Have this process and those it starts keep freed memory for reuse (glibc only).

    Returns what was done, for the log: an empty string where nothing was (not glibc, or
    settings of the allocator's own in the environment, which are the user's and kept).
    """
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return ""
    given = [name for name in VARIABLES if name in os.environ]
    tunables = os.environ.get("GLIBC_TUNABLES", "").split(":")
    if any(entry.startswith("glibc.malloc.") for entry in tunables):
        given.append("GLIBC_TUNABLES")
    if given:
        return f"the C allocator's settings are the environment's ({', '.join(given)})"
    mallopt = ctypes.CDLL(None).mallopt
    settings = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not all(mallopt(parameter, value) for parameter, value in settings):
        return ""  # refused (0): a glibc that caps the thresholds lower
    os.environ.update({name: str(value) for name, value in VARIABLES.items()})
    return (
        f"freed memory kept for reuse (glibc: mmap threshold {MMAP_THRESHOLD >> 20} MiB, "
        f"trim threshold {TRIM_THRESHOLD >> 30} GiB)"
    )
