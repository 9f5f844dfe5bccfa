"""The all-reduce curves through published nccl-tests rows, by hand and against the rows."""

from __future__ import annotations

import pytest

from segscale.bench.predict.interconnects import (
    INTERCONNECTS,
    PUBLISHED_TABLES,
    Interconnect,
    Published,
    find_interconnect,
    from_published,
    ring_bytes,
)
from tests.bench.predict.test_collective_timing import LINK


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


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: LINK.allreduce_time(1e6, 0), "n"),
        (lambda: LINK.allreduce_time(-1.0, 2), "nbytes"),
        (lambda: Interconnect("x", (), ""), "points"),
        (lambda: Interconnect("x", ((2.0, 1.0), (1.0, 2.0)), ""), "points"),
    ],
)
def test_invalid_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=rf"^{argument}\w* must"):
        call()
