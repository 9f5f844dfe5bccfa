"""gloo's link through host memory in the step model, with fixed inputs, by hand."""

from __future__ import annotations

import sys

import pytest

from segscale.bench.predict.collective_timing import backward_pass, expected_max_standard_normal
from segscale.bench.predict.host_staged_link import (
    GpuBackend,
    HostStagedLink,
    PinnedCopies,
    gpu_backend,
)
from segscale.bench.predict.interconnects import Interconnect
from segscale.bench.predict.step_model import predict
from segscale.bench.predict.step_profile import (
    BatchNormSync,
    Collectives,
    Gradients,
    Host,
    StepProfile,
)
from segscale.errors import ConfigError
from tests.bench.predict.test_collective_timing import LINK

# Copies at 2 GB/s to the host and 4 GB/s back; the host all-reduce LINK's b / 1 GB/s.
COPIES = PinnedCopies(2e9, 4e9, "round numbers")
GLOO = HostStagedLink(LINK, COPIES)
E2 = expected_max_standard_normal(2)


def _at_end(*sizes: float) -> Gradients:
    """Buckets all ready when the backward pass ends: nothing of them is hidden."""
    return Gradients(tuple(sizes), tuple(1.0 for _ in sizes))


def test_an_allreduce_through_host_memory_is_its_three_parts_in_series():
    # 1e8 bytes over 2 ranks: 0.05 s to the host, 0.1 s all-reduced there, 0.025 s back.
    assert GLOO.parts(1e8, 2) == pytest.approx(
        {"device_to_host_s": 0.05, "host_allreduce_s": 0.1, "host_to_device_s": 0.025}
    )
    assert GLOO.allreduce_time(1e8, 2) == pytest.approx(0.175)
    assert GLOO.allreduce_time(1e8, 1) == 0.0
    assert GLOO.latency == LINK.latency
    assert GLOO.bus_bandwidth < LINK.bus_bandwidth  # the copies slow every all-reduce
    assert GLOO.host_synced and not LINK.host_synced
    assert GLOO.gradient_parts(_at_end(1e8, 3e8), 2) == pytest.approx(
        {"device_to_host_s": 0.2, "host_allreduce_s": 0.4, "host_to_device_s": 0.1}
    )


def test_the_gloo_term_adds_the_copies_and_grows_with_the_gradient_bytes():
    # Backward 0.1 s, one bucket ready at its end: all of its all-reduce is exposed.
    profile = StepProfile(0.05, 0.1, 0.0, batch=4)
    one = predict(profile, _at_end(1e8), 2, GLOO)
    assert one.exposed_communication_s == pytest.approx(0.175)  # D2H + host + H2D
    assert one.step_s == pytest.approx(0.15 + 0.175)
    nccl_like = predict(profile, _at_end(1e8), 2, LINK)  # the host all-reduce alone
    assert nccl_like.exposed_communication_s == pytest.approx(0.1)
    two = predict(profile, _at_end(2e8), 2, GLOO)
    assert two.exposed_communication_s == pytest.approx(0.35)
    assert two.efficiency < one.efficiency < nccl_like.efficiency


def test_gloo_buckets_run_beside_the_backward_pass_and_only_the_rest_shows():
    # ProcessGroupGloo queues the copies and the host all-reduce (host_staged_link):
    # a bucket of 1e8 bytes (0.175 s) ready at 25 % of a 1 s backward ends at 0.425 s.
    hidden = backward_pass(1.0, Gradients((1e8,), (0.25,)), 2, GLOO, Host())
    assert hidden.exposed_gradient_s == 0.0 and hidden.end_s == pytest.approx(1.0)
    # Ready at 50 % of a 0.1 s backward: it starts at 0.05 s and ends 0.125 s past it.
    shown = backward_pass(0.1, Gradients((1e8,), (0.5,)), 2, GLOO, Host())
    assert shown.exposed_gradient_s == pytest.approx(0.125)
    # Without overlap (CPU ranks) the whole of it adds, as for every link.
    serial = backward_pass(1.0, Gradients((1e8,), (0.25,)), 2, GLOO, Host(overlap=False))
    assert serial.exposed_gradient_s == pytest.approx(0.175)


def test_each_blocking_collective_over_gloo_is_a_host_sync_too():
    # 10 batch-norm layers (1 + 1 collectives, no host sync of their own), a 16-byte
    # loss normaliser; spreads 1 ms at a collective and 2 ms at a host sync; no buckets
    # in the way of the backward collectives (one tiny bucket ready at the end).
    profile = StepProfile(0.2, 0.4, 0.0, batch=4)
    host = Host(skew_s=1e-3, host_sync_skew_s=2e-3)
    bn = BatchNormSync(10, 100.0, 1, 1, 0)
    staged = predict(profile, _at_end(1.0), 2, GLOO, host, bn, Collectives((16.0,)))
    collective = GLOO.allreduce_time(100.0, 2) + E2 * 1e-3  # the sync point
    assert staged.sync_batchnorm_s == pytest.approx(20 * collective + 20 * E2 * 2e-3, rel=1e-6)
    normaliser = GLOO.allreduce_time(16.0, 2) + E2 * 1e-3 + E2 * 2e-3
    assert staged.collectives_s == pytest.approx(normaliser, rel=1e-6)
    # An NCCL link with the same curve: the same sync points, no host syncs.
    plain = predict(profile, _at_end(1.0), 2, LINK, host, bn, Collectives((16.0,)))
    assert plain.sync_batchnorm_s == pytest.approx(20 * (LINK.allreduce_time(100.0, 2) + E2 * 1e-3))


def test_gloo_s_two_threads_let_a_collective_pass_a_bucket():
    # Backward 1 s; a bucket of 3e8 bytes ready at 0.25 s; one batch-norm collective at
    # 0.5 s. On one channel it waits for the bucket (ends 0.25 + 0.525 = 0.775 s); on
    # gloo's two it runs at once on the other.
    gradients = Gradients((3e8,), (0.25,))
    one = HostStagedLink(LINK, COPIES, channels=1)
    queued = backward_pass(1.0, gradients, 2, one, Host(), blocking=1, blocking_bytes=8.0)
    small = one.allreduce_time(8.0, 2)
    assert queued.sync_batchnorm_s == pytest.approx(0.275 + small, rel=1e-6)
    beside = backward_pass(1.0, gradients, 2, GLOO, Host(), blocking=1, blocking_bytes=8.0)
    assert beside.sync_batchnorm_s == pytest.approx(small, rel=1e-6)
    assert beside.end_s == pytest.approx(1.0 + small, rel=1e-6)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: PinnedCopies(0.0, 1e9, ""), "device_to_host"),
        (lambda: PinnedCopies(1e9, float("inf"), ""), "host_to_device"),
        (lambda: HostStagedLink(LINK, COPIES, channels=0), "channels"),
        (lambda: GLOO.allreduce_time(-1.0, 2), "nbytes"),
        (lambda: GLOO.allreduce_time(1.0, 0), "n"),
    ],
)
def test_invalid_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=rf"^{argument} must"):
        call()


def test_its_numbers_for_bench_json():
    host = Interconnect("gloo", ((4.0, 1e-4), (2**20, 1e-3)), "measured")
    row = HostStagedLink(host, COPIES).as_dict()
    assert row["name"] == "gloo through host memory"
    assert (row["device_to_host"], row["host_to_device"]) == (2e9, 4e9)
    assert row["host_latency"] == 1e-4
    assert row["host_bus_bandwidth"] == pytest.approx(2**20 / 1e-3)
    assert "measured" in row["host_source"] and row["copies_source"] == "round numbers"


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
