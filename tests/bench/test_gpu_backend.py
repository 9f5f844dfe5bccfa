"""The GPU ranks' backend for bench: the platform simulated, the config's value checked."""

from __future__ import annotations

import sys

import pytest

from segscale.bench.gpu_backend import GpuBackend, gpu_backend
from segscale.errors import ConfigError


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        ("win32", GpuBackend("gloo", "Windows has no NCCL")),
        ("darwin", GpuBackend("gloo", "macOS has no NCCL")),
        ("linux", GpuBackend("nccl", "NCCL on Linux")),
    ],
)
def test_null_is_the_platform_s_choice(monkeypatch, platform, expected):
    monkeypatch.setattr(sys, "platform", platform)
    assert gpu_backend(None) == expected
    assert gpu_backend(None, platform) == expected


@pytest.mark.parametrize("platform", ["win32", "linux"])
def test_gloo_chosen_in_the_config_is_gloo_everywhere(monkeypatch, platform):
    monkeypatch.setattr(sys, "platform", platform)
    backend = gpu_backend("gloo")
    assert backend == GpuBackend("gloo", "strategy.process_group_backend=gloo")


def test_nccl_chosen_on_linux_is_nccl(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert gpu_backend("nccl").name == "nccl"


@pytest.mark.parametrize("platform", ["win32", "darwin"])
def test_nccl_off_linux_is_refused_naming_the_key_and_the_platform(monkeypatch, platform):
    monkeypatch.setattr(sys, "platform", platform)
    with pytest.raises(
        ConfigError, match=r"strategy\.process_group_backend='nccl' is not allowed: \w+ has no NCCL"
    ):
        gpu_backend("nccl")


@pytest.mark.parametrize(
    "value",
    [
        "mpi",
        "ucc",
        "gloo ",
        " nccl",
        "GLOO",  # as the training runs refuse it (one allow-list: segscale.platforms)
        "cpu:gloo,cuda:nccl",
        "cuda:gloo",
        "",
        "none",
        1,
        True,
    ],
)
def test_anything_else_is_refused_with_what_is_expected(value):
    with pytest.raises(
        ConfigError, match=r"strategy\.process_group_backend=.* is not allowed: .*null picks nccl"
    ):
        gpu_backend(value, "linux")
