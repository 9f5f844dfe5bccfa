"""Sync points and the backward pass with its buckets, with fixed inputs, by hand."""

from __future__ import annotations

import pytest

from segscale.bench.predict.collective_timing import (
    backward_pass,
    expected_max_standard_normal,
    sync_point,
)
from segscale.bench.predict.interconnects import Interconnect
from segscale.bench.predict.step_profile import Gradients, Host

# 1 GB/s bus bandwidth and no latency: an all-reduce of b bytes over 2 ranks takes b / 1e9 s.
LINK = Interconnect("hand", ((1.0, 1e-9), (1e12, 1e3)), "round numbers")
# 10 µs whatever the size below 1 kB: a latency-only link for small collectives.
FLAT = Interconnect("flat", ((1e3, 1e-5),), "round numbers")


def _gradients(count: int, size: float) -> Gradients:
    return Gradients(tuple([size] * count), tuple((i + 1) / count for i in range(count)))


def test_expected_max_standard_normal():
    assert expected_max_standard_normal(1) == 0.0
    for n, known in ((2, 0.5642), (4, 1.0294), (8, 1.4236)):
        assert expected_max_standard_normal(n) == pytest.approx(known, abs=1e-3)


def test_sync_point_is_the_collective_and_the_latest_rank():
    host = Host(skew_s=1e-3)
    assert sync_point(100.0, 2, FLAT, host) == pytest.approx(1e-5 + 0.5642e-3, abs=1e-7)
    assert sync_point(100.0, 2, FLAT, Host()) == 1e-5


def test_backward_hides_buckets_behind_compute():
    # 4 buckets of 1e8 bytes over 2 ranks at 1 GB/s: 0.1 s each.
    def exposed(backward: float) -> float:
        return backward_pass(backward, _gradients(4, 1e8), 2, LINK, Host()).exposed_gradient_s

    assert exposed(4.0) == pytest.approx(0.1)  # each done before the next: the last shows
    assert exposed(0.4) == pytest.approx(0.1)  # keeps pace
    assert exposed(0.2) == pytest.approx(0.05 + 0.4 - 0.2)  # falls behind: they queue
    assert backward_pass(0.2, _gradients(4, 1e8), 1, LINK, Host()).end_s == 0.2


def test_a_blocking_collective_waits_for_the_bucket_in_front_of_it():
    # Backward 1 s; one bucket of 3e8 bytes (0.3 s) ready at 0.25 s; one batch-norm
    # collective (10 µs) at 0.5 s must wait until the bucket ends at 0.55 s.
    gradients = Gradients((3e8,), (0.25,))
    link = Interconnect("two", ((1e3, 1e-5), (1e4, 1e-5), (1e8, 0.1), (1e12, 1e3)), "")
    result = backward_pass(1.0, gradients, 2, link, Host(), blocking=1, blocking_bytes=8.0)
    assert result.sync_batchnorm_s == pytest.approx(0.05 + 1e-5, rel=1e-3)
    assert result.exposed_gradient_s == 0.0
    assert result.end_s == pytest.approx(1.05 + 1e-5, rel=1e-3)


def test_without_overlap_communication_adds_in_full():
    host = Host(overlap=False)
    result = backward_pass(1.0, _gradients(2, 1e8), 2, LINK, host, blocking=3, blocking_bytes=1e3)
    assert result.exposed_gradient_s == pytest.approx(0.2)
    assert result.sync_batchnorm_s == pytest.approx(3 * 1e-6)
    assert result.end_s == pytest.approx(1.2 + 3e-6)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: expected_max_standard_normal(0), "n"),
    ],
)
def test_invalid_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=rf"^{argument}\w* must"):
        call()
