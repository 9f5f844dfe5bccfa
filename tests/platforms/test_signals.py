import re
import signal
import sys
import threading

import pytest

from segscale.platforms import signals
from segscale.platforms.signals import (
    StopSignalError,
    default_preemption_signals,
    stop_signal_name,
    stop_signal_names,
)
from tests.conftest import REPO


@pytest.mark.parametrize(
    ("platform", "defaults"),
    [
        ("linux", ("SIGTERM", "SIGUSR2")),
        ("darwin", ("SIGTERM", "SIGUSR2")),
        ("win32", ("SIGINT", "SIGBREAK")),  # Ctrl-C, Ctrl-Break
    ],
)
def test_each_platform_has_its_default_preemption_signals(platform, defaults, monkeypatch):
    assert default_preemption_signals(platform) == defaults
    monkeypatch.setattr(sys, "platform", platform)  # the default: this platform's
    assert default_preemption_signals() == defaults
    assert set(defaults) <= set(stop_signal_names())


def test_names_are_taken_in_any_case_with_or_without_sig():
    assert stop_signal_name("usr2", "linux") == "SIGUSR2"
    assert stop_signal_name("SIGTERM", "darwin") == "SIGTERM"
    assert stop_signal_name("break", "win32") == "SIGBREAK"
    assert stop_signal_name("sigint", "win32") == "SIGINT"


def test_a_signal_the_platform_lacks_is_refused_naming_the_platform_and_what_it_has():
    with pytest.raises(StopSignalError) as refused:
        stop_signal_name("SIGUSR2", "win32")
    assert str(refused.value) == (
        "'SIGUSR2' does not exist on Windows; it has SIGINT, SIGBREAK, SIGTERM to stop a run"
    )
    with pytest.raises(
        StopSignalError, match=r"'SIGBREAK' does not exist on Linux; it has SIGTERM"
    ):
        stop_signal_name("SIGBREAK", "linux")
    with pytest.raises(StopSignalError, match=r"'SIGKILL' does not exist on Windows"):
        stop_signal_name("SIGKILL", "win32")


@pytest.mark.parametrize("name", ["SIGKILL", "SIGSTOP", "SIGSEGV", "SIGCHLD", "SIGWINCH"])
def test_a_signal_that_cannot_stop_a_run_is_refused(name):
    with pytest.raises(StopSignalError, match=rf"'{name}' cannot stop a run on Linux; the"):
        stop_signal_name(name, "linux")


@pytest.mark.parametrize(
    "name",
    # Built to slip past: handler constants, real-time and console events, padding,
    # numbers, prefixes and suffixes, empty and non-strings.
    [
        "SIG_IGN",
        "SIG_DFL",
        "SIGRTMIN",
        "CTRL_C_EVENT",
        "CTRL_BREAK_EVENT",
        " SIGTERM",
        "SIGTERM\n",
        "SIGSIGTERM",
        "SIGTERMX",
        "15",
        15,
        "",
        None,
        True,
        "SIGTERM,SIGINT",
    ],
)
def test_only_the_allowed_names_pass(name):
    for platform in ("linux", "darwin", "win32"):
        with pytest.raises(StopSignalError):
            stop_signal_name(name, platform)


def test_every_stop_signal_of_this_platform_exists_here():
    names = stop_signal_names()
    assert "SIGTERM" in names and "SIGBREAK" not in names  # Linux, where the tests run
    assert all(isinstance(signal.Signals[name], signal.Signals) for name in names)


def test_ignore_stop_signals_ignores_each_of_them_here():
    numbers = [signal.Signals[name] for name in stop_signal_names()]
    before = {number: signal.getsignal(number) for number in numbers}
    try:
        signals.ignore_stop_signals()
        assert all(signal.getsignal(number) == signal.SIG_IGN for number in numbers)
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def test_a_childs_exit_is_left_to_the_default_inside_the_block():
    def torch_like(number, frame):  # stands in for torch's SIGCHLD handler
        raise AssertionError("not while stopping workers")

    previous = signal.signal(signal.SIGCHLD, torch_like)
    try:
        with signals.child_exits_unwatched():
            assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
        assert signal.getsignal(signal.SIGCHLD) is torch_like
        # Elsewhere than the main thread handlers cannot be set: nothing is touched.
        seen = []

        def in_thread():
            with signals.child_exits_unwatched():
                seen.append(signal.getsignal(signal.SIGCHLD))

        thread = threading.Thread(target=in_thread)
        thread.start()
        thread.join()
        assert seen == [torch_like]
    finally:
        signal.signal(signal.SIGCHLD, previous)


def test_windows_has_no_sigchld_to_set_aside(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(signal, "signal", lambda *args: pytest.fail("no signal to set"))
    with signals.child_exits_unwatched():
        pass


def test_the_documented_signals_are_the_platforms():
    text = (REPO / "docs" / "clusters.md").read_text(encoding="utf-8")
    rows = {
        platform: next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
        for platform, name in (("linux", "Linux, macOS"), ("win32", "Windows"))
    }
    for platform, row in rows.items():
        _, defaults, allowed = row.strip("|").split("|")
        assert f"`[{', '.join(default_preemption_signals(platform))}]`" in defaults
        assert re.findall(r"`(SIG[A-Z0-9]+)`", allowed) == list(stop_signal_names(platform))
