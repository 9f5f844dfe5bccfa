"""The DataLoader's start method: the platform's default, and values a platform lacks refused."""

import multiprocessing
import sys

import pytest

from segscale.platforms.parallel import (
    BackendError,
    StartMethodError,
    default_process_group_backend,
    default_start_method,
    process_group_backend,
    process_group_backends,
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


PLATFORMS = ("linux", "darwin", "win32")


@pytest.mark.parametrize(
    ("platform", "device", "backends"),
    [
        ("linux", "cuda", ("nccl", "gloo")),  # WSL2 too: its sys.platform is linux
        ("linux", "cpu", ("gloo",)),
        ("linux", "mps", ("gloo",)),
        ("darwin", "cuda", ("gloo",)),
        ("darwin", "mps", ("gloo",)),
        ("darwin", "cpu", ("gloo",)),
        ("win32", "cuda", ("gloo",)),  # no NCCL in PyTorch's Windows builds
        ("win32", "cpu", ("gloo",)),
    ],
)
def test_each_platform_and_device_has_its_backends_the_default_first(
    platform, device, backends, monkeypatch
):
    assert process_group_backends(device, platform) == backends
    assert default_process_group_backend(device, platform) == backends[0]
    assert process_group_backend(None, device, platform) == backends[0]
    for backend in backends:  # each one it has, asked for, is taken
        assert process_group_backend(backend, device, platform) == backend
    monkeypatch.setattr(sys, "platform", platform)  # without one: this platform's
    assert default_process_group_backend(device) == backends[0]
    assert process_group_backend(None, device) == backends[0]


def test_gloo_is_taken_on_linux_gpus_when_asked_for():
    assert process_group_backend("gloo", "cuda", "linux") == "gloo"


def test_nccl_on_windows_is_refused_naming_the_platform_what_it_has_and_wsl2():
    with pytest.raises(BackendError) as refused:
        process_group_backend("nccl", "cuda", "win32")
    assert str(refused.value) == (
        "Windows has no NCCL (PyTorch has it on Linux only); ranks on cuda devices on "
        "Windows have gloo (null picks gloo); for NCCL between its GPUs, run under WSL2"
    )


def test_nccl_on_macos_is_refused_without_the_windows_advice():
    with pytest.raises(BackendError) as refused:
        process_group_backend("nccl", "mps", "darwin")
    assert str(refused.value) == (
        "macOS has no NCCL (PyTorch has it on Linux only); ranks on mps devices on macOS "
        "have gloo (null picks gloo)"
    )


def test_nccl_for_cpu_ranks_on_linux_is_refused():
    with pytest.raises(BackendError) as refused:
        process_group_backend("nccl", "cpu", "linux")
    assert str(refused.value) == (
        "NCCL moves tensors between CUDA GPUs only; ranks on cpu devices on Linux have "
        "gloo (null picks gloo)"
    )


# torch itself lower-cases a backend and takes per-device lists; we take only our names.
@pytest.mark.parametrize(
    "value",
    [
        "NCCL",
        "Gloo",
        "nccl ",
        " gloo",
        "gloo\n",
        "nccl:gloo",
        "cuda:nccl",
        "cpu:gloo,cuda:nccl",
        "gloo,nccl",
        "mpi",
        "ucc",
        "xccl",
        "auto",
        "none",
        "",
        "undefined",
        True,
        0,
        ["gloo"],
        b"gloo",
    ],
)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_anything_but_the_names_is_refused_saying_what_the_ranks_have(value, platform):
    with pytest.raises(BackendError, match=r"not a process-group backend; ranks on cuda"):
        process_group_backend(value, "cuda", platform)
