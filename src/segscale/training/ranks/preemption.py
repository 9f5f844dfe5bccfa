"""Preemption: a signal stops every rank at the next safe point, with a checkpoint to resume from.

Clusters warn a job before they take its machines away: SLURM sends ``SIGUSR2`` (as
submitit asks; ``SIGUSR1`` if the job says so) some time before the limit, and spot
instances and Kubernetes send ``SIGTERM`` with a short grace period, to one process
or to all of them; on Windows, a console's Ctrl-C (``SIGINT``) and Ctrl-Break
(``SIGBREAK``) reach every process attached to it (the signals each platform has, and
those a run takes by default: ``segscale.platforms.signals``). Whatever the run is
doing, it stops at its next safe point and exits with ``EXIT_PREEMPTED``;
``ckpt_path=auto`` then continues it with exactly the steps, learning rates and patches
it had not taken:

- before the first training step of a launch (the config and dataset checks, the
  network, the ranks' start, the sanity check) and after the last (the reports), there
  is nothing to save that a resume cannot redo: the signal's handler ends the run at
  once (``Phase.SETUP``, ``Phase.FINISHING``);
- while training (``Phase.TRAINING``), ``PreemptionStop`` stops every rank after the
  same optimizer step, or at the same batch of a validation, which it abandons; rank 0
  writes ``checkpoints/last.ckpt`` with the training state of the last finished step.

The deadline is armed when the stop begins, not at the signal: a rank still alive
``deadline_s`` seconds after it began to stop (stuck in a collective with a rank that
died, or on the way out) exits anyway, so no stop leaves a process behind, and a
warning signal sent long before the kill (SLURM's ``--signal=USR2@90``) costs nothing
until the run acts on it. A main thread blocked in C when the signal comes (a hung
collective, a device sync) runs no Python handler, so cannot begin to stop: a thread of
its own hears of the signal through ``signal.set_wakeup_fd`` (written by the C-level
handler) and ends the process ``deadline_s`` after a signal no handler took. It ends it
with ``os._exit``, writing to stderr directly: the blocked thread may hold the logging
locks. Later signals (SLURM repeats them, a scheduler escalates) neither restart nor
shorten the deadline. The default (25 s) fits inside SLURM's 30 s between ``SIGTERM``
and ``SIGKILL`` (``KillWait``).

Lightning's own SIGTERM handling is switched off: it exits 0 (``SIGTERMException`` is a
``SystemExit`` without a code), saves nothing, and under DDP runs a collective inside
the signal handler, which leaves the ranks waiting for each other
(Lightning-AI/pytorch-lightning#21404, #14610).
"""

from __future__ import annotations

import contextlib
import enum
import faulthandler
import logging
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import Any

import lightning as L
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

from segscale.errors import ConfigError, RunStopped
from segscale.platforms.signals import StopSignalError, default_preemption_signals, stop_signals

log = logging.getLogger(__name__)

EXIT_PREEMPTED = 75
"""Exit status of a run stopped by a preemption signal (``EX_TEMPFAIL``: run it again)."""
DEADLINE_KEY = "training.preemption_deadline_s"
SIGNALS_KEY = "training.preemption_signals"

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class Preempted(RunStopped):
    """Every rank stopped on a preemption signal; ``last.ckpt`` holds what there was to save."""

    status = "preempted"
    exit_code = EXIT_PREEMPTED

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.previous_handler: Handler = None

    def hand_over(self) -> None:
        """Call the handler that was installed before ours for the signal, if any.

        submitit's requeues the job (on global rank 0) and exits; a run without one
        goes on to exit with ``EXIT_PREEMPTED``. Python's own ``SIGINT`` handler is not
        one to call: it would raise ``KeyboardInterrupt`` where the run has stopped
        already (Ctrl-C, a preemption signal on Windows).
        """
        handler = self.previous_handler
        if callable(handler) and handler is not signal.default_int_handler:
            handler(signal.Signals[self.details["signal"]], None)


class Phase(enum.Enum):
    """Where a run is, for what a preemption signal does there."""

    SETUP = "before training"
    TRAINING = "training"
    FINISHING = "after training"


class PreemptionSignals:
    """Handlers for the preemption signals, installed for a whole run (``train``).

    A handler records the first signal; later ones change nothing. In ``Phase.SETUP``
    and ``Phase.FINISHING`` it raises ``Preempted`` at once, from wherever the main
    thread is; in ``Phase.TRAINING`` it only notes the signal, and ``PreemptionStop``
    acts on it at the next safe point (``begin_stop``). ``SignalDeadline`` ends a process
    that outlives its stop. On leaving, the wakeup descriptor's previous owner is put
    back and the deadline is stopped; the handlers from before come back too, except
    after a preemption: the process is then about to exit, and a signal on the way out
    must not end it before it has written its files (they stay noted).
    Handlers can only be installed from the main thread; elsewhere (a test's thread)
    none are.
    """

    def __init__(self, names: Sequence[str] | str, deadline_s: float) -> None:
        self.signals = _signals(names)
        self.deadline_s = float(deadline_s)
        self.phase = Phase.SETUP
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Handler] = {}
        self._deadline: SignalDeadline | None = None

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles the callbacks: handlers and deadlines belong to this process.
        return self.__dict__ | {"_previous": {}, "_deadline": None}

    def __enter__(self) -> PreemptionSignals:
        if threading.current_thread() is threading.main_thread() and self.signals:
            self._deadline = SignalDeadline(self.signals, self.deadline_s)
            for number in self.signals:
                self._previous[number] = signal.getsignal(number)
                signal.signal(number, self._note)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(error, Preempted):
            name = error.details.get("signal")
            error.previous_handler = self._previous.get(signal.Signals[name]) if name else None
            self._stop_deadline()  # the stop is done: the caller exits
            self._previous = {}  # ours stay: more signals are only noted
            return
        self.restore()

    def enter(self, phase: Phase) -> None:
        """Move the run to ``phase``; a signal already noted stops it now if that phase does."""
        self.phase = phase
        if phase is not Phase.TRAINING and self.received is not None:
            self._stop_now(self.received)

    def begin_stop(self) -> None:
        """The run starts to stop: from now on, the deadline counts."""
        if self._deadline is not None:
            self._deadline.begin()

    def restore(self) -> None:
        """Put the handlers and the wakeup descriptor from before back; no deadline."""
        self._stop_deadline()
        for number, handler in self._previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _note(self, number: int, frame: FrameType | None) -> None:
        if self.received is not None:
            return  # the first signal decides; later ones change nothing
        self.received = signal.Signals(number)
        if self._deadline is not None:
            self._deadline.noted()
        if self.phase is not Phase.TRAINING:
            self._stop_now(self.received)

    def _stop_now(self, received: signal.Signals) -> None:
        """End the run where it is: there is nothing to save that a resume cannot redo."""
        self.begin_stop()
        if self.phase is Phase.SETUP:
            where = "before training started: nothing to save yet"
        else:
            where = "after training: its checkpoints are written"
        raise Preempted(
            f"preempted: {received.name} received {where}; run again with ckpt_path=auto "
            "(in this run folder) to continue",
            signal=received.name,
            phase=self.phase.value,
        )


class SignalDeadline:
    """Ends the process ``deadline_s`` after its stop began, or after a signal no handler took.

    A thread reads what arrives on a socket: the signal numbers that Python's C-level
    handler writes there (``signal.set_wakeup_fd``), so that it hears of a signal even
    while the main thread is blocked in C, and the main thread's own news: the handler
    took the signal (``noted``), the stop began (``begin``), the run ended (``cancel``).
    At the deadline it writes the threads' stacks and one line to stderr, without logging
    (whose locks a stuck thread may hold), and calls ``os._exit(EXIT_PREEMPTED)``. Created
    and cancelled in the main thread (``signal.set_wakeup_fd`` requires it).
    """

    NOTED, BEGIN, CANCEL = 253, 254, 255  # not signal numbers

    def __init__(self, signals: Sequence[signal.Signals], deadline_s: float) -> None:
        self.numbers = {int(number) for number in signals}
        self.deadline_s = deadline_s
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="signal-deadline", daemon=True)
        self._thread.start()

    def noted(self) -> None:
        """The main thread's handler took the signal (it runs Python: it can stop)."""
        self._send(self.NOTED)

    def begin(self) -> None:
        """The stop began: the process has ``deadline_s`` from now (later calls change nothing)."""
        self._send(self.BEGIN)

    def cancel(self) -> None:
        """Stop watching: no deadline, the wakeup descriptor from before back."""
        signal.set_wakeup_fd(self._previous_fd)
        self._send(self.CANCEL)
        self._thread.join()
        self._reader.close()
        self._writer.close()

    def _send(self, news: int) -> None:
        # Full (never read) or closed: there is nothing left to tell.
        with contextlib.suppress(OSError):
            self._writer.send(bytes([news]))

    def _watch(self) -> None:
        signalled: str | None = None
        noted = False
        ends_at: float | None = None  # the deadline, once one is armed
        reason = ""
        while True:
            timeout = None if ends_at is None else max(0.0, ends_at - time.monotonic())
            ready, _, _ = select.select([self._reader], [], [], timeout)
            if not ready:
                self._exit(reason)
            for news in self._reader.recv(64):
                if news == self.CANCEL:
                    return
                if news == self.NOTED:
                    noted = True
                    if ends_at is not None and reason.startswith("no handler"):
                        ends_at = None  # it was taken: the deadline waits for the stop
                elif news == self.BEGIN and not reason.startswith("still"):
                    ends_at = time.monotonic() + self.deadline_s
                    reason = f"still running {self.deadline_s:g} s after its stop began"
                elif news in self.numbers and signalled is None:
                    signalled = signal.Signals(news).name
                    if not noted and ends_at is None:
                        ends_at = time.monotonic() + self.deadline_s
                        reason = (
                            f"no handler took {signalled} within {self.deadline_s:g} s "
                            "(the main thread is blocked)"
                        )

    def _exit(self, reason: str) -> None:
        faulthandler.dump_traceback(file=2, all_threads=True)  # where it was stuck
        os.write(2, f"{_rank()}: {reason}; exiting now\n".encode())
        os._exit(EXIT_PREEMPTED)


class _NoLightningSignalHandlers(_SignalConnector):
    """Lightning's signal connector without its handlers: ``PreemptionSignals`` has them."""

    def register_signal_handlers(self) -> None:
        """Install nothing (see the module's docstring for why)."""


def without_lightning_signal_handlers(trainer: L.Trainer) -> None:
    """Keep ``trainer`` from installing its SIGTERM (and SLURM SIGUSR1) handlers."""
    # A private attribute: Lightning has no switch for it (pytorch-lightning#21404).
    trainer._signal_connector = _NoLightningSignalHandlers(trainer)


def _signals(names: Sequence[str] | str) -> list[signal.Signals]:
    """The signals ``training.preemption_signals`` names (``auto``: the platform's defaults).

    A name the platform lacks, or one that cannot stop a run (``SIGKILL``), is refused,
    naming the platform and the signals it has; the form (``auto`` or a list) is the
    schema's to check.
    """
    if names == "auto":
        names = default_preemption_signals()
    try:
        return stop_signals(names)
    except StopSignalError as error:
        raise ConfigError(f"{SIGNALS_KEY}: {error}") from None


def _rank() -> str:
    return f"rank {os.environ.get('RANK', os.environ.get('LOCAL_RANK', '0'))}"
