import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import lightning as L
import pytest

from segscale.configs import compose_config
from segscale.data.sampling.loaders import init_worker
from segscale.errors import ConfigError
from segscale.platforms.processes import PR_SET_PDEATHSIG
from segscale.platforms.signals import stop_signal_names
from segscale.training.ranks.preemption import (
    EXIT_PREEMPTED,
    Phase,
    Preempted,
    PreemptionSignals,
    without_lightning_signal_handlers,
)


def test_signal_names_and_the_deadline_are_checked():
    assert PreemptionSignals(["SIGTERM", "usr2"], 25).signals == [signal.SIGTERM, signal.SIGUSR2]
    assert PreemptionSignals("auto", 25).signals == [signal.SIGTERM, signal.SIGUSR2]  # Linux's
    with pytest.raises(
        ConfigError, match=r"training.preemption_signals: 'SIGKILL' cannot stop a run on Linux"
    ):
        PreemptionSignals(["SIGKILL"], 25)
    with pytest.raises(ConfigError, match=r"'SIGNOPE' does not exist on Linux; it has SIGTERM"):
        PreemptionSignals(["SIGNOPE"], 25)
    for bad in ("SIGTERM", "automatic", "null", "15", "{a:SIGTERM}"):  # auto or a list
        with pytest.raises(ConfigError, match=r"training.preemption_signals=.* expected auto"):
            compose_config("train", [f"training.preemption_signals={bad}"])
    for bad in ("0", "-1", "inf", "'25'"):
        with pytest.raises(ConfigError, match=r"training.preemption_deadline_s="):
            compose_config("train", [f"training.preemption_deadline_s={bad}"])


def test_a_signal_windows_lacks_is_refused_there_naming_windows_and_what_it_has(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")  # only the names differ: refused before lookup
    with pytest.raises(ConfigError) as refused:
        PreemptionSignals(["SIGTERM", "SIGUSR2"], 25)
    assert str(refused.value) == (
        "training.preemption_signals: 'SIGUSR2' does not exist on Windows; it has SIGINT, "
        "SIGBREAK, SIGTERM to stop a run"
    )
    assert PreemptionSignals(["SIGINT"], 25).signals == [signal.SIGINT]  # Ctrl-C


def test_while_training_the_first_signal_is_noted_and_the_handlers_from_before_come_back():
    before = signal.getsignal(signal.SIGUSR2)
    seen = []
    signal.signal(signal.SIGUSR1, lambda number, frame: seen.append(number))
    try:
        with PreemptionSignals(["SIGUSR1", "SIGUSR2"], deadline_s=60) as signals:
            signals.enter(Phase.TRAINING)
            os.kill(os.getpid(), signal.SIGUSR2)
            os.kill(os.getpid(), signal.SIGUSR1)  # a second signal changes nothing
            assert signals.received == signal.SIGUSR2
            assert seen == []  # ours replaced the handler from before
        assert signal.getsignal(signal.SIGUSR2) == before
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_before_training_a_signal_ends_the_run_at_once_and_the_wakeup_fd_comes_back():
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    started = time.monotonic()
    try:
        with pytest.raises(Preempted) as stopped, PreemptionSignals(["SIGUSR2"], 60):
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(30)  # the dataset check, say: the handler does not wait for it
        assert time.monotonic() - started < 5
        assert stopped.value.details == {"signal": "SIGUSR2", "phase": "before training"}
        assert "nothing to save yet" in str(stopped.value)
        assert signal.set_wakeup_fd(before) == before  # its previous owner has it back
        assert not [t for t in threading.enumerate() if t.name == "signal-deadline"]
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_a_signal_noted_in_training_ends_the_run_once_training_is_over():
    try:
        with PreemptionSignals(["SIGUSR2"], 60) as signals:
            signals.enter(Phase.TRAINING)
            os.kill(os.getpid(), signal.SIGUSR2)  # noted: the next safe point acts on it
            with pytest.raises(Preempted, match="after training: its checkpoints are written"):
                signals.enter(Phase.FINISHING)
            signals.enter(Phase.TRAINING)  # a stop already raised is not raised again
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_a_preempted_run_hands_the_signal_to_the_handler_from_before():
    """submitit's handler (requeue, then exit) runs once the checkpoint is written."""
    calls = []
    signal.signal(signal.SIGUSR2, lambda number, frame: calls.append(number))
    signals = PreemptionSignals(["SIGUSR2"], deadline_s=60)
    try:
        with pytest.raises(Preempted) as stopped, signals:
            signals.enter(Phase.TRAINING)
            os.kill(os.getpid(), signal.SIGUSR2)
            raise Preempted("stop", signal="SIGUSR2", step=3, epoch=0, checkpoint="x")
        os.kill(os.getpid(), signal.SIGUSR2)  # on the way out: still only noted
        assert calls == []
        stopped.value.hand_over()
        assert calls == [signal.SIGUSR2]
        assert stopped.value.exit_code == EXIT_PREEMPTED
    finally:
        signals.restore()
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_ctrl_c_as_a_preemption_signal_is_not_handed_to_pythons_keyboardinterrupt():
    # Ctrl-C (SIGINT: Windows' default, or a list's on Linux) stopped the run with its
    # checkpoint: Python's own handler from before would raise KeyboardInterrupt now.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signals = PreemptionSignals(["SIGINT"], deadline_s=60)
    try:
        with pytest.raises(Preempted) as stopped, signals:
            signals.enter(Phase.TRAINING)
            os.kill(os.getpid(), signal.SIGINT)
            assert signals.received == signal.SIGINT
            raise Preempted("stop", signal="SIGINT", step=3, epoch=0, checkpoint="x")
        assert stopped.value.previous_handler is signal.default_int_handler
        stopped.value.hand_over()  # no KeyboardInterrupt
    finally:
        signals.restore()
        signal.signal(signal.SIGINT, signal.default_int_handler)


# Each script writes the time the deadline counts from to ``start``; the deadline is 2 s.
STUCK = {
    # Blocked in C for good (a hung collective, a device sync): no Python handler runs,
    # so the run cannot begin to stop; the deadline counts from the signal, which comes
    # from another thread once the main thread is blocked.
    "blocked in C when the signal comes": textwrap.dedent(
        """
        def signal_now():
            Path("start").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGTERM)
        mutex = ctypes.create_string_buffer(64)  # zeroed: a default pthread mutex
        threading.Timer(0.5, signal_now).start()
        ctypes.CDLL(None).pthread_mutex_lock(mutex)
        ctypes.CDLL(None).pthread_mutex_lock(mutex)  # deadlocks (default mutex type)
        """
    ),
    # Training: the signal is only noted, and no deadline runs until the stop begins
    # (a long validation after SLURM's early warning, say: longer than the deadline).
    # Then a second signal neither restarts nor shortens the deadline.
    "stuck after its stop began": textwrap.dedent(
        """
        signals.enter(Phase.TRAINING)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(3)
        Path("start").write_text(repr(time.time()))
        signals.begin_stop()
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGUSR2)
        signals.begin_stop()
        time.sleep(60)
        """
    ),
    # Holding the logging lock that a late exit through logging would wait for.
    "holding the logging lock": textwrap.dedent(
        """
        signals.enter(Phase.TRAINING)
        logging.getLogger().handlers[0].acquire()
        os.kill(os.getpid(), signal.SIGTERM)
        Path("start").write_text(repr(time.time()))
        signals.begin_stop()
        time.sleep(60)
        """
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("stuck", STUCK)
def test_a_rank_still_alive_at_the_deadline_exits_anyway(stuck, tmp_path):
    script = textwrap.dedent(
        """
        import ctypes, logging, os, signal, threading, time
        from pathlib import Path
        from segscale.training.ranks.preemption import Phase, PreemptionSignals
        logging.basicConfig()
        with PreemptionSignals(["SIGTERM", "SIGUSR2"], deadline_s=2) as signals:
        """
    ) + textwrap.indent(STUCK[stuck], " " * 4)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    ended = time.time()
    assert done.returncode == EXIT_PREEMPTED, done.stderr
    assert "Current thread" in done.stderr  # the stacks: where it was stuck
    assert "; exiting now" in done.stderr
    # Timed from what it counts from: the deadline (2 s), not a restarted one (3 s).
    assert 2.0 <= ended - float((tmp_path / "start").read_text()) < 2.9


def test_a_run_that_ends_in_time_cancels_the_deadline_and_restores_the_wakeup_fd():
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    with PreemptionSignals(["SIGUSR2"], deadline_s=0.2) as signals:
        signals.enter(Phase.TRAINING)
        os.kill(os.getpid(), signal.SIGUSR2)
        signals.begin_stop()
        assert signals.received == signal.SIGUSR2
    time.sleep(0.5)  # past the deadline: the test process is still here
    assert signal.set_wakeup_fd(before) == before
    assert not [t for t in threading.enumerate() if t.name == "signal-deadline"]


def test_lightning_installs_no_signal_handlers_of_its_own():
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    before = signal.getsignal(signal.SIGTERM)
    without_lightning_signal_handlers(trainer)
    trainer._signal_connector.register_signal_handlers()
    assert signal.getsignal(signal.SIGTERM) == before
    # The test has power: Lightning's own connector replaces it.
    connector = type(trainer._signal_connector).__mro__[1](trainer)
    connector.register_signal_handlers()
    try:
        assert signal.getsignal(signal.SIGTERM) != before
    finally:
        connector.teardown()


def test_dataloader_workers_leave_preemption_signals_to_their_process():
    numbers = [signal.Signals[name] for name in stop_signal_names()]
    assert signal.SIGINT in numbers and signal.SIGUSR1 in numbers  # any a run may take
    before = {number: signal.getsignal(number) for number in numbers}
    try:
        init_worker(0)
        for number in numbers:
            assert signal.getsignal(number) == signal.SIG_IGN
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, 0)  # this test process is no worker


@pytest.mark.slow
def test_dataloader_workers_end_with_their_process(tmp_path):
    """However it ends (here ``os._exit``, as the late exit of a stuck preemption), and
    while the worker is busy: decoding a large tile, or stuck reading a file."""
    script = textwrap.dedent(
        """
        import multiprocessing, os, time
        from torch.utils.data import DataLoader, Dataset
        from segscale.data.sampling.loaders import init_worker

        class Slow(Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, index):
                time.sleep(60 if index else 0)
                return index

        loader = DataLoader(Slow(), num_workers=1, worker_init_fn=init_worker)
        next(iter(loader))  # the worker now works on the next items
        with open("worker.pid", "w") as file:
            file.write(str(multiprocessing.active_children()[0].pid))
        os._exit(0)
        """
    )
    # No pipes: the worker would hold them, and the run would wait for it.
    with open(tmp_path / "stderr", "w") as stderr:
        code = subprocess.call([sys.executable, "-c", script], cwd=tmp_path, stderr=stderr)
    assert code == 0, (tmp_path / "stderr").read_text()
    worker, exited = int((tmp_path / "worker.pid").read_text()), time.monotonic()
    try:
        while _running(worker) and time.monotonic() < exited + 10:
            time.sleep(0.05)
        assert not _running(worker), "the worker outlived its process"
    finally:
        if _running(worker):
            os.kill(worker, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
