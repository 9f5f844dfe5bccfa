import resource
import signal
import subprocess
import sys
import textwrap
import types

import pytest

from segscale.platforms import processes


def test_the_process_age_is_the_same_from_linux_and_from_psutil(monkeypatch):
    linux = processes.process_age()
    monkeypatch.setattr(sys, "platform", "darwin")  # macOS and Windows: psutil's start time
    elsewhere = processes.process_age()
    assert linux is not None and elsewhere is not None
    assert 0 < linux < 24 * 3600
    # psutil adds Linux's boot time in whole seconds: within one of the exact age.
    assert elsewhere == pytest.approx(linux, abs=1.1)


def test_without_proc_linux_says_nothing_of_the_age(monkeypatch):
    def no_proc(path, **kwargs):
        raise FileNotFoundError(path)  # a container without /proc

    monkeypatch.setattr(processes.Path, "read_text", no_proc)
    assert processes.process_age() is None


@pytest.mark.parametrize(("platform", "factor"), [("linux", 1024), ("darwin", 1)])
def test_peak_memory_is_in_bytes_on_posix_systems(platform, factor, monkeypatch):
    # ru_maxrss is KiB on Linux and bytes on macOS: bench once overstated macOS 1024×.
    usage = types.SimpleNamespace(ru_maxrss=300_000)
    monkeypatch.setattr(resource, "getrusage", lambda who: usage)
    monkeypatch.setattr(sys, "platform", platform)
    assert processes.peak_memory_bytes() == 300_000 * factor


def test_peak_memory_on_windows_is_the_peak_working_set(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    info = types.SimpleNamespace(peak_wset=123_456_789)
    monkeypatch.setattr(processes.psutil.Process, "memory_info", lambda self: info)
    assert processes.peak_memory_bytes() == 123_456_789


def test_the_peak_memory_here_is_this_processs_in_bytes():
    # At least about what it holds now (the kernel updates its peak now and then).
    peak, now = processes.peak_memory_bytes(), processes.psutil.Process().memory_info().rss
    assert 0.9 * now <= peak <= processes.psutil.virtual_memory().total


def test_this_process_is_ended_at_once_from_any_thread():
    script = textwrap.dedent(
        """
        import threading, time
        from segscale.platforms.processes import end_this_process
        threading.Thread(target=end_this_process).start()
        time.sleep(60)
        """
    )
    ended = subprocess.run([sys.executable, "-c", script], timeout=30)
    assert ended.returncode == -signal.SIGKILL


def test_a_child_is_interrupted_with_sigint_here():
    script = textwrap.dedent(
        """
        import sys, time
        try:
            print("started", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            sys.exit(7)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, **processes.interruptible_child()
    )
    try:
        child.stdout.readline()  # started
        processes.interrupt(child)
        assert child.wait(timeout=30) == 7
    finally:
        child.kill()
        child.wait()


class RecordedChild:
    """A child that records the signals sent to it."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def send_signal(self, number: int) -> None:
        self.sent.append(number)


def test_on_windows_a_child_in_its_own_group_is_sent_ctrl_break(monkeypatch):
    # Windows sends console events to process groups, and Ctrl-C to none but its own:
    # the child gets a group of its own and Ctrl-Break, which it hears as SIGBREAK.
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0x200, raising=False)
    monkeypatch.setattr(signal, "CTRL_BREAK_EVENT", 1, raising=False)
    assert processes.interruptible_child() == {"creationflags": 0x200}
    child = RecordedChild()
    processes.interrupt(child)
    assert child.sent == [1]
