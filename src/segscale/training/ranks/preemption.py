"""Preemption: a signal stops every rank at the same step, with a checkpoint to resume from.

Clusters warn a job before they take its machines away: SLURM sends ``SIGUSR2`` (as
submitit asks; ``SIGUSR1`` if the job says so) some time before the limit, and spot
instances and Kubernetes send ``SIGTERM`` with a short grace period, to one process
or to all of them. Whichever rank gets it, every rank stops after the same training
step, rank 0 writes ``checkpoints/last.ckpt`` (atomically, through the checkpoint
plugin), ``summary.json`` says ``preempted``, and the run exits with
``EXIT_PREEMPTED``: ``ckpt_path=auto`` then continues it with exactly the steps,
learning rates and patches it had not taken.

The ranks agree without a host sync on the device: each step, every rank's flag goes
into an all-reduce on a CPU (gloo) group, started after one step and read after the
next, so the host never waits for it; the stop comes at most two steps after the
signal. A rank still alive ``exit_s`` seconds after the signal (stuck in a collective
with a rank that died, say) exits anyway, so no signal leaves a process behind. That
deadline does not depend on the main thread: a rank blocked in C (a hung collective, a
device sync) runs no Python signal handler, so a thread of its own hears of the signal
through ``signal.set_wakeup_fd`` (written by the C-level handler) and ends the process
with ``os._exit``, writing to stderr directly: the blocked thread may hold the logging
locks. The default deadline (25 s) is under SLURM's grace between ``SIGTERM`` and
``SIGKILL`` (30 s).

Lightning's own SIGTERM handling is switched off: it exits 0 (``SIGTERMException`` is a
``SystemExit`` without a code), saves nothing, and under DDP runs a collective inside
the signal handler, which leaves the ranks waiting for each other
(Lightning-AI/pytorch-lightning#21404, #14610).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import Any

import lightning as L
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

from segscale.errors import ConfigError, RunStopped

log = logging.getLogger(__name__)

EXIT_PREEMPTED = 75
"""Exit status of a run stopped by a preemption signal (``EX_TEMPFAIL``: run it again)."""

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class Preempted(RunStopped):
    """Every rank stopped at the same step on a preemption signal; ``last.ckpt`` holds it."""

    status = "preempted"
    exit_code = EXIT_PREEMPTED

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.previous_handler: Handler = None

    def hand_over(self) -> None:
        """Call the handler that was installed before ours for the signal, if any.

        submitit's requeues the job (on global rank 0) and exits; a run without one
        goes on to exit with ``EXIT_PREEMPTED``.
        """
        handler = self.previous_handler
        if callable(handler):
            handler(signal.Signals[self.details["signal"]], None)


class PreemptionSignals:
    """Handlers that note a preemption signal, installed while the run trains.

    A handler only records the first signal (a second one, during the checkpoint's
    save say, changes nothing); ``PreemptionStop`` acts on the record at the next step.
    The first signal also starts the deadline after which a process that has not
    exited exits anyway (``SignalDeadline``). On leaving, the handlers from before are
    put back, except when the run was preempted: the process then exits, and a signal
    on the way out must not end it before it has written its files.
    Handlers can only be installed from the main thread; elsewhere (a test's thread)
    none are.
    """

    def __init__(self, names: Sequence[str], exit_s: float = 25.0) -> None:
        self.signals = [_signal(name) for name in names]
        if not (isinstance(exit_s, int | float) and exit_s > 0):
            raise ConfigError(
                f"training.preemption_exit_s={exit_s!r} is not allowed: expected seconds > 0"
            )
        self.exit_s = float(exit_s)
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Handler] = {}
        self._deadline: SignalDeadline | None = None

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles the callbacks: handlers and deadlines belong to this process.
        return self.__dict__ | {"_previous": {}, "_deadline": None}

    def __enter__(self) -> PreemptionSignals:
        if threading.current_thread() is threading.main_thread() and self.signals:
            for number in self.signals:
                self._previous[number] = signal.getsignal(number)
                signal.signal(number, self._note)
            self._deadline = SignalDeadline(self.signals, self.exit_s)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(error, Preempted):
            # The process is about to exit: more signals stay noted (not deadly) and the
            # deadline still ends it if something on the way out hangs.
            error.previous_handler = self._previous.get(signal.Signals[error.details["signal"]])
            return
        self.restore()

    def restore(self) -> None:
        """Put the handlers from before back and stop the deadline."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        for number, handler in self._previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _note(self, number: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(number)


class SignalDeadline:
    """Ends the process ``exit_s`` seconds after the first of ``signals``, from a thread.

    The thread reads the signal numbers that Python's C-level handler writes to the
    wakeup file descriptor, so it hears of a signal even while the main thread is
    blocked in C and runs no Python handler. At the deadline it writes the threads'
    stacks and one line to stderr, without logging (whose locks a stuck thread may
    hold), and calls ``os._exit(EXIT_PREEMPTED)``. Created and cancelled in the main
    thread (``signal.set_wakeup_fd`` requires it).
    """

    def __init__(self, signals: Sequence[signal.Signals], exit_s: float) -> None:
        self.numbers = {int(number) for number in signals}
        self.exit_s = exit_s
        self._cancelled = threading.Event()
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="signal-deadline", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """Stop watching: no deadline, the wakeup descriptor from before back."""
        signal.set_wakeup_fd(self._previous_fd)
        self._cancelled.set()
        self._writer.send(b"\0")  # wakes the thread; no signal has the number 0
        self._thread.join()
        self._reader.close()
        self._writer.close()

    def _watch(self) -> None:
        name = self._first_signal()
        if name is None or self._cancelled.wait(self.exit_s):
            return
        line = f"{_rank()}: still running {self.exit_s:.0f} s after {name}; exiting now\n"
        faulthandler.dump_traceback(file=2, all_threads=True)  # where it was stuck
        os.write(2, line.encode())
        os._exit(EXIT_PREEMPTED)

    def _first_signal(self) -> str | None:
        """The name of the first of the signals to arrive; ``None`` once cancelled."""
        while not self._cancelled.is_set():
            for number in self._reader.recv(64):
                if number in self.numbers:
                    return signal.Signals(number).name
        return None


class _NoLightningSignalHandlers(_SignalConnector):
    """Lightning's signal connector without its handlers: ``PreemptionSignals`` has them."""

    def register_signal_handlers(self) -> None:
        """Install nothing (see the module's docstring for why)."""


def without_lightning_signal_handlers(trainer: L.Trainer) -> None:
    """Keep ``trainer`` from installing its SIGTERM (and SLURM SIGUSR1) handlers."""
    # A private attribute: Lightning has no switch for it (pytorch-lightning#21404).
    trainer._signal_connector = _NoLightningSignalHandlers(trainer)


def _signal(name: str) -> signal.Signals:
    """The signal called ``name`` (``SIGTERM`` or ``TERM``), one that can be caught."""
    text = str(name).upper()
    text = text if text.startswith("SIG") else f"SIG{text}"
    number = getattr(signal.Signals, text, None)
    if number is None or number in (signal.SIGKILL, signal.SIGSTOP):
        raise ConfigError(
            f"training.preemption_signals: {name!r} is not a signal that can be caught; "
            "expected names such as SIGTERM, SIGUSR1, SIGUSR2"
        )
    return number


def _rank() -> str:
    return f"rank {os.environ.get('RANK', os.environ.get('LOCAL_RANK', '0'))}"
