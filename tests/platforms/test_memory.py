"""glibc keeps freed memory for reuse once told to, in this process and those it starts."""

import os
import subprocess
import sys
import textwrap

import pytest

from segscale.platforms import memory

# A 64 MiB block allocated, written and freed again, as a training step does with its
# activations: the minor page faults of the last 4 rounds (glibc's defaults: fresh pages
# every round).
FAULTS = textwrap.dedent(
    """
    import ctypes, os, resource, sys
    if sys.argv[1] == "keep":
        from segscale.platforms.memory import keep_freed_memory
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
    assert variable == str(memory.MMAP_THRESHOLD) and unset == "None"  # for its children


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
    monkeypatch.setattr(memory.sys, "platform", "linux")
    monkeypatch.setattr(memory.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: FakeLibc(calls))
    monkeypatch.setattr(memory.os, "environ", {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"})
    assert memory.keep_freed_memory().startswith("freed memory kept for reuse")
    assert calls == [(-3, memory.MMAP_THRESHOLD), (-1, memory.TRIM_THRESHOLD)]
    assert memory.os.environ["MALLOC_TRIM_THRESHOLD_"] == str(memory.TRIM_THRESHOLD)


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
    monkeypatch.setattr(memory.sys, "platform", platform)
    monkeypatch.setattr(memory.platform, "libc_ver", lambda: libc)
    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: FakeLibc(calls))
    monkeypatch.setattr(memory.os, "environ", {})
    assert memory.keep_freed_memory() == "" and calls == [] and memory.os.environ == {}


def test_a_glibc_that_refuses_the_threshold_is_left_as_it_is(monkeypatch):
    calls = []
    monkeypatch.setattr(memory.sys, "platform", "linux")
    monkeypatch.setattr(memory.platform, "libc_ver", lambda: ("glibc", "2.17"))
    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: FakeLibc(calls, takes=False))
    monkeypatch.setattr(memory.os, "environ", {})
    assert memory.keep_freed_memory() == "" and memory.os.environ == {}
