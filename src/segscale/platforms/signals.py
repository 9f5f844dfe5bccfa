"""The signals that can stop a run, per platform, and those a run takes by default.

POSIX systems (Linux, macOS) are asked to stop by a scheduler, a cloud or a terminal
with ``SIGTERM`` (Kubernetes, spot instances, ``kill``), ``SIGUSR1``/``SIGUSR2`` (SLURM's
warning, SGE's ``-notify``), ``SIGINT`` (Ctrl-C), ``SIGHUP`` (a closed terminal),
``SIGQUIT`` (Ctrl-backslash) and ``SIGXCPU`` (a CPU-time limit). Windows has none of the
POSIX ones but ``SIGTERM`` (which only the process itself can raise): a console
delivers Ctrl-C as ``SIGINT`` and Ctrl-Break as ``SIGBREAK``, to every process attached
to it. Signals that cannot be caught (``SIGKILL``, ``SIGSTOP``) or that report a fault
(``SIGSEGV``, ``SIGFPE``) are not on either list.

The default preemption signals are written here once: ``SIGTERM`` and ``SIGUSR2`` on
POSIX systems, ``SIGINT`` and ``SIGBREAK`` on Windows (``training.preemption_signals:
auto``).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from segscale.platforms import WINDOWS, platform_name

POSIX_STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGXCPU")
"""The signals by which a POSIX system asks a process to stop."""
WINDOWS_STOP_SIGNALS = ("SIGINT", "SIGBREAK", "SIGTERM")
"""The signals by which Windows asks a process to stop (Ctrl-C, Ctrl-Break; SIGTERM raised)."""
WINDOWS_SIGNALS = (*WINDOWS_STOP_SIGNALS, "SIGABRT", "SIGFPE", "SIGILL", "SIGSEGV")
"""Every signal Python has on Windows (its C runtime's)."""

POSIX_DEFAULT = ("SIGTERM", "SIGUSR2")
"""The preemption signals of a run on Linux and macOS: clusters' and clouds' warnings."""
WINDOWS_DEFAULT = ("SIGINT", "SIGBREAK")
"""The preemption signals of a run on Windows: Ctrl-C and Ctrl-Break."""


class StopSignalError(ValueError):
    """A signal name the platform does not have, or that cannot stop a run there."""


def stop_signal_names(platform: str | None = None) -> tuple[str, ...]:
    """The signals that can stop a run on ``platform`` (default: this one)."""
    platform = sys.platform if platform is None else platform
    return WINDOWS_STOP_SIGNALS if platform == WINDOWS else POSIX_STOP_SIGNALS


def default_preemption_signals(platform: str | None = None) -> tuple[str, ...]:
    """The signals a run takes as preemption signals on ``platform`` unless told otherwise."""
    platform = sys.platform if platform is None else platform
    return WINDOWS_DEFAULT if platform == WINDOWS else POSIX_DEFAULT


def stop_signal_name(name: object, platform: str | None = None) -> str:
    """``name`` (``SIGTERM``, ``term``) as the signal's name, if it can stop a run on ``platform``.

    Raises ``StopSignalError``, saying what ``platform`` has, for a name it lacks or one
    that cannot stop a run there (``SIGKILL`` cannot be caught).
    """
    platform = sys.platform if platform is None else platform
    text = str(name).upper()
    text = text if text.startswith("SIG") else f"SIG{text}"
    allowed = stop_signal_names(platform)
    if text in allowed:
        return text
    where, has = platform_name(platform), ", ".join(allowed)
    if text in _signals_of(platform):
        raise StopSignalError(f"{name!r} cannot stop a run on {where}; the signals that can: {has}")
    raise StopSignalError(f"{name!r} does not exist on {where}; it has {has} to stop a run")


def stop_signals(names: Sequence[object]) -> list[signal.Signals]:
    """The signals called ``names`` on this platform (``StopSignalError`` for one it lacks)."""
    return [signal.Signals[stop_signal_name(name)] for name in names]


def _signals_of(platform: str) -> set[str]:
    """Every signal name ``platform`` has (this one's from its ``signal`` module)."""
    if platform == WINDOWS:
        return set(WINDOWS_SIGNALS)
    if sys.platform == "win32":  # a POSIX platform asked about from Windows
        return set(POSIX_STOP_SIGNALS) | {"SIGKILL", "SIGSTOP"}
    return set(signal.Signals.__members__)


def ignore_stop_signals() -> None:
    """Ignore, in this process, every signal that can stop a run here (a DataLoader worker).

    A cluster or a console signals every process of a job; the stop is the run's main
    process's to make, whichever of these signals it takes.
    """
    for name in stop_signal_names():
        signal.signal(signal.Signals[name], signal.SIG_IGN)


@contextmanager
def child_exits_unwatched() -> Iterator[None]:
    """Inside the block, a child's exit raises nothing in this process.

    POSIX: torch's ``SIGCHLD`` handler (it reports a DataLoader worker that exited) is set
    aside, in the main thread, where handlers live. Windows has no ``SIGCHLD``.
    """
    if sys.platform == "win32":
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)
