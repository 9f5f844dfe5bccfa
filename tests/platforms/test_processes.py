import os
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


# A 64 MiB block allocated, written and freed again, as a training step does with its
# activations: the minor page faults of the last 4 rounds (glibc's defaults: fresh pages
# every round).
FAULTS = textwrap.dedent(
    """
    import ctypes, os, resource, sys
    if sys.argv[1] == "keep":
        from segscale.platforms.processes import keep_freed_memory
        print(keep_freed_memory())
    else:
        print("")
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    size = 64 * 2**20  # above glibc's largest dynamic mmap threshold (32 MiB)
    for round in range(6):
        if round == 2:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)  # every page touched, as a tensor's are
        libc.free(block)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(os.environ.get("MALLOC_MMAP_THRESHOLD_"))
    """
)


def faults(how: str, **environment: str) -> tuple[str, int, str]:
    """What ``keep_freed_memory`` said, the faults of 4 rounds, and the variable it set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", FAULTS, how],
        env=clean | environment,
        capture_output=True,
        text=True,
        check=True,
    )
    said, count, variable = done.stdout.splitlines()
    return said, int(count), variable


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_memory_is_reused_rather_than_faulted_in_again():
    said, kept, variable = faults("keep")
    _, default, unset = faults("default")
    assert said.startswith("freed memory kept for reuse (glibc: mmap threshold 256 MiB")
    assert default > 4 * 16_000  # 16k pages of 4 KiB a round, fresh each time
    assert kept < 1_000  # the same pages every round
    assert variable == str(processes.MMAP_THRESHOLD) and unset == "None"  # for its children


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
@pytest.mark.parametrize(
    "environment",
    [{"MALLOC_TRIM_THRESHOLD_": "0"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}],
)
def test_the_allocator_settings_someone_gave_are_kept(environment):
    said, count, _ = faults("keep", **environment)
    assert said == f"the C allocator's settings are the environment's ({next(iter(environment))})"
    assert count > 4 * 16_000  # trim threshold 0: every free handed back, as they asked


def test_other_tunables_are_no_allocator_settings(monkeypatch):
    calls = []
    monkeypatch.setattr(processes.sys, "platform", "linux")
    monkeypatch.setattr(processes.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(processes.ctypes, "CDLL", lambda name: FakeLibc(calls))
    monkeypatch.setattr(processes.os, "environ", {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"})
    assert processes.keep_freed_memory().startswith("freed memory kept for reuse")
    assert calls == [(-3, processes.MMAP_THRESHOLD), (-1, processes.TRIM_THRESHOLD)]
    assert processes.os.environ["MALLOC_TRIM_THRESHOLD_"] == str(processes.TRIM_THRESHOLD)


class FakeLibc:
    """A C library whose ``mallopt`` notes its calls and takes (or refuses) every one."""

    def __init__(self, calls: list, takes: bool = True) -> None:
        self.calls, self.takes = calls, takes

    def mallopt(self, parameter: int, value: int) -> int:
        self.calls.append((parameter, value))
        return int(self.takes)


@pytest.mark.parametrize(
    ("platform", "libc"),
    [("darwin", ("", "")), ("win32", ("", "")), ("linux", ("", "")), ("linux", ("musl", "1.2"))],
)
def test_nothing_is_done_but_on_glibc(monkeypatch, platform, libc):
    calls = []
    monkeypatch.setattr(processes.sys, "platform", platform)
    monkeypatch.setattr(processes.platform, "libc_ver", lambda: libc)
    monkeypatch.setattr(processes.ctypes, "CDLL", lambda name: FakeLibc(calls))
    monkeypatch.setattr(processes.os, "environ", {})
    assert processes.keep_freed_memory() == "" and calls == [] and processes.os.environ == {}


def test_a_glibc_that_refuses_the_threshold_is_left_as_it_is(monkeypatch):
    calls = []
    monkeypatch.setattr(processes.sys, "platform", "linux")
    monkeypatch.setattr(processes.platform, "libc_ver", lambda: ("glibc", "2.17"))
    monkeypatch.setattr(processes.ctypes, "CDLL", lambda name: FakeLibc(calls, takes=False))
    monkeypatch.setattr(processes.os, "environ", {})
    assert processes.keep_freed_memory() == "" and processes.os.environ == {}
