"""What differs in processes: this one's age and peak memory, ending it, a child's interrupt.

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
"""

from __future__ import annotations

import contextlib
import ctypes
import os
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
