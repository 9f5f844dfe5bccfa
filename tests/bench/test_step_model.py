"""The step model's terms with fixed inputs, by hand (published rows: test_published_scaling)."""

from __future__ import annotations

import pytest

from segscale.bench.interconnects import (
    INTERCONNECTS,
    PUBLISHED_TABLES,
    Interconnect,
    Published,
    find_interconnect,
    from_published,
    ring_bytes,
)
from segscale.bench.step_model import (
    BatchNormSync,
    Collectives,
    Gradients,
    Host,
    StepProfile,
    backward_pass,
    efficiency,
    expected_max_standard_normal,
    predict,
    speedup,
    sync_point,
)

# 1 GB/s bus bandwidth and no latency: an all-reduce of b bytes over 2 ranks takes b / 1e9 s.
LINK = Interconnect("hand", ((1.0, 1e-9), (1e12, 1e3)), "round numbers")
# 10 µs whatever the size below 1 kB: a latency-only link for small collectives.
FLAT = Interconnect("flat", ((1e3, 1e-5),), "round numbers")


def _profile(backward: float, forward: float = 1.0, jitter: float = 0.0) -> StepProfile:
    return StepProfile(
        forward_s=forward, backward_s=backward, optimizer_s=0.0, batch=1, jitter=jitter
    )


def _gradients(count: int, size: float) -> Gradients:
    return Gradients(tuple([size] * count), tuple((i + 1) / count for i in range(count)))


# --- interconnects ----------------------------------------------------------------------------


def test_ring_bytes_and_the_curve_between_points():
    assert ring_bytes(100.0, 2) == 100.0
    assert ring_bytes(100.0, 8) == 175.0
    link = Interconnect("x", ((100.0, 1e-5), (10_000.0, 1e-3)), "")
    assert link.allreduce_time(1e6, 1) == 0.0
    assert link.allreduce_time(10.0, 2) == 1e-5  # below the first point: the latency floor
    assert link.allreduce_time(1000.0, 2) == pytest.approx(1e-4)  # log-log halfway
    # Past the last point: at its bus bandwidth (1e4 bytes / 1e-3 s = 1e7 bytes/s)
    assert link.allreduce_time(20_000.0, 2) == pytest.approx(1e-3 + 1e4 / 1e7)
    assert (link.latency, link.bus_bandwidth) == (1e-5, pytest.approx(1e7))


def test_every_interconnect_passes_through_its_published_rows():
    for link in INTERCONNECTS:
        rows, _ = PUBLISHED_TABLES[link.name]
        for row in rows:
            # Rows of two tables at one ring size are averaged; none is off by more than that.
            assert link.allreduce_time(row.nbytes, row.ranks) == pytest.approx(
                row.time_us * 1e-6, rel=0.25
            )
        # Bandwidth falls for small messages: 64 KiB reaches under half the large busbw.
        small = ring_bytes(64 * 2**10, 8) / link.allreduce_time(64 * 2**10, 8)
        assert small < 0.5 * link.bus_bandwidth


def test_from_published_merges_and_keeps_the_curve_monotone():
    rows = (Published(2, 8, 10.0), Published(2, 16, 9.0), Published(2, 1e6, 100.0))
    link = from_published("x", rows, "")
    flat = [value for point in link.points for value in point]
    assert flat == pytest.approx([8.0, 10e-6, 16.0, 10e-6, 1e6, 100e-6])


def test_interconnect_table():
    assert [link.name for link in INTERCONNECTS] == list(PUBLISHED_TABLES)
    assert find_interconnect("nvlink a100").name == "NVLink A100"
    with pytest.raises(ValueError, match=r"'PCIe 3.0 x16'.*'InfiniBand NDR'"):
        find_interconnect("Ethernet 10G")


# --- the terms -----------------------------------------------------------------------------------


def test_expected_max_standard_normal():
    assert expected_max_standard_normal(1) == 0.0
    for n, known in ((2, 0.5642), (4, 1.0294), (8, 1.4236)):
        assert expected_max_standard_normal(n) == pytest.approx(known, abs=1e-3)


def test_sync_point_is_the_collective_and_the_latest_rank():
    host = Host(skew_s=1e-3)
    assert sync_point(100.0, 2, FLAT, host) == pytest.approx(1e-5 + 0.5642e-3, abs=1e-7)
    assert sync_point(100.0, 2, FLAT, Host()) == 1e-5


def test_uniform_gradients_form_ddp_buckets():
    # 1 MiB first bucket, then 25 MiB; a bucket closes with the gradient that reaches it.
    mib = 2**20
    g = Gradients.uniform([0.5 * mib, 0.75 * mib, 10 * mib, 20 * mib, 1 * mib])
    assert g.buckets == (1.25 * mib, 30 * mib, 1 * mib)
    assert g.ready == pytest.approx((1.25 / 32.25, 31.25 / 32.25, 1.0))
    assert g.total_bytes == 32.25 * mib


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


def test_predict_by_hand():
    # Step 1 s (0.3 + 0.6 + 0.1), 10 samples; 4 buckets of 1e8 bytes, the last ends 0.1 s
    # past backward. 2 ranks: 1.1 s, plus the loss normaliser's 16 bytes (16 ns).
    profile = StepProfile(0.3, 0.6, 0.1, batch=10)
    p = predict(profile, _gradients(4, 1e8), 2, LINK, collectives=Collectives((16.0,)))
    assert p.exposed_communication_s == pytest.approx(0.1)
    assert p.collectives_s == pytest.approx(16e-9)
    assert p.step_s == pytest.approx(1.1, abs=1e-6)
    assert p.throughput == pytest.approx(20 / 1.1, rel=1e-5)
    assert p.speedup == pytest.approx(2 / 1.1, rel=1e-5)
    assert p.efficiency == pytest.approx(1 / 1.1, rel=1e-5)
    assert not p.data_bound
    single = predict(profile, _gradients(4, 1e8), 1, LINK)
    assert single.step_s == pytest.approx(1.0)
    assert (single.speedup, single.efficiency) == (1.0, 1.0)


def test_predict_with_every_term():
    # Overhead 2 ms, slowdown 1.25, 10 batch-norm layers (1 + 1 collectives, 1 host sync,
    # 5 ms extra arithmetic), skew 1 ms collectives / 2 ms host syncs, jitter 10 %.
    profile = StepProfile(0.2, 0.4, 0.0, batch=4, jitter=0.1, overhead_s=0.002)
    host = Host(slowdown=1.25, overlap=False, skew_s=1e-3, host_sync_skew_s=2e-3)
    bn = BatchNormSync(10, 100.0, 1, 1, 1, compute_s=0.005)
    gradients = _gradients(1, 1e6)  # 1 ms on LINK
    p = predict(profile, gradients, 2, LINK, host, bn, Collectives((8.0,)))
    e = 0.5642
    collective = 100e-9 + e * 1e-3
    assert p.compute_s == pytest.approx(0.75)
    sync = 0.005 * 1.25 + 10 * e * 2e-3 + 20 * collective
    assert p.sync_batchnorm_s == pytest.approx(sync, rel=1e-3)
    assert p.collectives_s == pytest.approx(8e-9 + e * 1e-3, rel=1e-3)
    assert p.exposed_communication_s == pytest.approx(1e-3)
    assert p.straggler_s == pytest.approx(0.1 * (0.75 + 0.005 * 1.25) * e, rel=1e-3)
    total = 0.75 + 0.002 + sync + p.collectives_s + 1e-3 + p.straggler_s
    assert p.step_s == pytest.approx(total)
    assert p.speedup == pytest.approx(8 / total / (4 / 0.602))


def test_predict_data_caps():
    profile = StepProfile(0.3, 0.6, 0.1, batch=10)
    # Compute alone: 18.2 samples/s on 2 ranks; each rank's workers give 5: data-bound.
    capped = predict(profile, _gradients(4, 1e8), 2, LINK, data_rate_1=5.0, data_rate_n=5.0)
    assert capped.data_bound
    assert capped.throughput == pytest.approx(10.0)
    assert capped.speedup == pytest.approx(2.0)
    # Fewer workers per rank at 2 ranks than at 1: 9.5 alone, 4 each with 2 ranks.
    shared = predict(profile, _gradients(4, 1e8), 2, LINK, data_rate_1=9.5, data_rate_n=4.0)
    assert shared.throughput == pytest.approx(8.0)
    assert shared.speedup == pytest.approx(8.0 / 9.5)


def test_speedup_and_efficiency():
    assert speedup(700.0, 100.0) == pytest.approx(7.0)
    assert efficiency(7.0, 8) == pytest.approx(0.875)
    assert efficiency(1.0, 1) == 1.0


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: LINK.allreduce_time(1e6, 0), "n"),
        (lambda: LINK.allreduce_time(-1.0, 2), "nbytes"),
        (lambda: StepProfile(0.0, 1.0, 0.0, 1), "forward_s"),
        (lambda: StepProfile(1.0, -1.0, 0.0, 1), "backward_s"),
        (lambda: StepProfile(1.0, 1.0, -0.1, 1), "optimizer_s"),
        (lambda: StepProfile(1.0, 1.0, 0.0, 0), "batch"),
        (lambda: StepProfile(1.0, 1.0, 0.0, 1, jitter=-0.1), "jitter"),
        (lambda: StepProfile(1.0, 1.0, 0.0, 1, overhead_s=-1.0), "overhead_s"),
        (lambda: Gradients((), ()), "buckets"),
        (lambda: Gradients((1.0,), (1.5,)), "ready"),
        (lambda: BatchNormSync(-1, 8.0), "layers"),
        (lambda: BatchNormSync(1, 0.0), "message_bytes"),
        (lambda: Host(slowdown=0.5), "slowdown"),
        (lambda: Host(skew_s=-1.0), "skew_s"),
        (lambda: expected_max_standard_normal(0), "n"),
        (
            lambda: predict(_profile(1.0), _gradients(1, 1.0), 2, LINK, data_rate_n=0.0),
            "data_rate_n",
        ),
        (lambda: speedup(0.0, 1.0), "throughput_n"),
        (lambda: efficiency(2.0, 0), "n"),
        (lambda: Interconnect("x", (), ""), "points"),
        (lambda: Interconnect("x", ((2.0, 1.0), (1.0, 2.0)), ""), "points"),
    ],
)
def test_invalid_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=rf"^{argument}\w* must"):
        call()
