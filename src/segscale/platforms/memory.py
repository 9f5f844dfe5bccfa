"""What differs in the C allocator: glibc (Linux) hands freed memory back after every step.

A CPU training step allocates and frees the same large tensors every step (activations,
their gradients). glibc's ``malloc`` serves those above its mmap threshold with fresh
``mmap`` pages and returns the top of its heap once more than its trim threshold lies
free there; its dynamic threshold (raised to the largest block freed, at most 32 MiB)
depends on what the process freed first. So one process's step page-faults twice as
often as another's doing the same work: DeepLabV3+ ResNet-18 on 8 patches of 256² took
43-107k minor faults a step with glibc's defaults and ~0 with both thresholds set, and
5-10% less time (issue 49). PyTorch leaves CPU allocation to the C library
(pytorch/pytorch#55675 and #53715 discuss a caching allocator of its own, never made the
default); Intel's CPU guides preload jemalloc or tcmalloc instead, which a pip install
cannot do.

``keep_freed_memory`` sets glibc's two thresholds for this process (``mallopt``) and,
through the environment variables glibc reads when a process starts, for the processes
it starts (DDP ranks, spawned workers). Nowhere else is anything done: macOS's and
Windows' allocators keep freed blocks themselves, and musl has no such settings.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

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
