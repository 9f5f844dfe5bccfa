"""What differs between Linux, macOS and Windows, in one place (the bottom layer).

Every name the operating systems do not share (``fcntl``, ``resource``, ``os.pread``,
``os.O_NOFOLLOW``, ``time.CLOCK_BOOTTIME``, ``signal.SIGUSR1``, ``/proc``, cgroups) is
touched only here, and only when a function runs, never at import: the rest of
segscale asks these modules and imports on every platform. Where the field has a
library for it, it is used: filelock for locks on descriptors, psutil for CPU affinity,
per-core times, a process's start and ending processes.

- ``signals``: the signals that can stop a run on each platform, and its defaults;
- ``files``: locks on descriptors, links not followed, folders opened, reads at an offset;
- ``processes``: this process's age and memory (peak, freed memory kept for reuse: glibc's
  allocator), ending it, interrupting a child;
- ``cores``: the cores this process may use, how busy they are, its cgroups' CPU quota.
- ``parallel``: how DataLoader workers may start (fork, spawn, forkserver), which backends
  ranks' process groups may use (NCCL, gloo), and the defaults.

Each takes the platform from ``sys.platform`` when it runs, so a test can simulate
another one where only a branch differs.
"""

from __future__ import annotations

import sys

WINDOWS = "win32"
"""``sys.platform`` on Windows. Code that touches a name only one platform has compares
``sys.platform`` with the literal instead: type checkers narrow only on those."""
MACOS = "darwin"


def platform_name(platform: str | None = None) -> str:
    """The name users know ``platform`` by (default: this one): Linux, macOS, Windows."""
    platform = sys.platform if platform is None else platform
    if platform == WINDOWS:
        return "Windows"
    if platform == MACOS:
        return "macOS"
    if platform.startswith("linux"):
        return "Linux"
    return platform
