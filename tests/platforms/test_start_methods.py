"""The DataLoader's start method: the platform's default, and values a platform lacks refused."""

import multiprocessing
import sys

import pytest

from segscale.platforms.start_methods import (
    StartMethodError,
    default_start_method,
    worker_start_method,
)


@pytest.mark.parametrize(
    ("platform", "expected"),
    [("win32", "spawn"), ("darwin", "spawn"), ("linux", "fork")],
)
def test_auto_is_the_platforms_default(platform, expected, monkeypatch):
    monkeypatch.setattr(sys, "version_info", (3, 11, 7))
    assert worker_start_method("auto", platform) == expected


def test_auto_on_linux_follows_python_from_3_14(monkeypatch):
    monkeypatch.setattr(sys, "version_info", (3, 14, 0))
    assert default_start_method("linux") == "forkserver"


def test_auto_on_this_platform_is_what_multiprocessing_would_use():
    assert worker_start_method("auto") == multiprocessing.get_context().get_start_method()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("platform", ["linux", "darwin"])
def test_posix_platforms_have_every_method(method, platform):
    assert worker_start_method(method, platform) == method


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_windows_refuses_what_it_lacks_naming_the_key_platform_and_values(method, monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(StartMethodError) as raised:
        worker_start_method(method)
    assert str(raised.value) == (
        f"datamodule.worker_start_method={method!r} is not allowed: Windows has no "
        f"{method!r} start method; expected one of spawn, auto"
    )
    assert worker_start_method("spawn") == "spawn"


@pytest.mark.parametrize(
    "value", ["Spawn", " spawn", "spawn\n", "fork:x", "threads", "", None, 1, True]
)
def test_an_unknown_value_is_refused(value):
    refused = r"^datamodule\.worker_start_method=.* is not allowed: "
    with pytest.raises(StartMethodError, match=refused):
        worker_start_method(value, "linux")
    with pytest.raises(StartMethodError, match=r"expected one of fork, spawn, forkserver, auto$"):
        worker_start_method(value, "linux")
