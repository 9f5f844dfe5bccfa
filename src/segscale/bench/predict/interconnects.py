"""Links between devices: all-reduce time as a function of message size, from nccl-tests.

Each row keeps the published ``all_reduce_perf`` (NVIDIA/nccl-tests) rows it is drawn
through, copied from the source named beside it. A row's curve is time against *ring
bytes*, 2(n-1)/n · bytes: nccl-tests' ``busbw`` is ring bytes / time (nccl-tests,
doc/PERFORMANCE.md), so one curve describes a link at any rank count. Between published
sizes the time is interpolated in log-log space, so the curve keeps what the tables show
and a latency + bandwidth line cannot: bandwidth falls steeply for small messages (at
64 KiB a link reaches 1-3 % of its large-message bus bandwidth) and NCCL's protocol
switches between 64 KiB and 32 MiB.

The latency floor is taken as independent of the rank count (it is the table's;
NCCL's small messages go through trees whose depth grows like log n). Tables run with one
process driving all GPUs (``-g 8``) inflate small-message times to 35-48 µs; where a table
from one process per GPU exists, its small rows are used instead (noted per row).

Sources (gathered by hand; none of these numbers is computed here):

- ``V100``: aistabci/abci2.0benchmark ``allreduce/intra_vnode/job.sh.7194325.nccl`` (4×
  V100-SXM2 NVLink, one process per GPU, NCCL 2.8.4) for 8 B-32 MiB; the large rows from
  konnase/konnase.github.io ``source/_posts/deep_learning/NCCL.md`` (8× V100-SXM2, DGX-1
  hybrid cube mesh, ``-g 8``).
- ``A100``: aistabci/abci2.0benchmark ``allreduce/intra_anode/job.sh.7194257.nccl`` (8×
  A100-SXM4 40GB, one process per GPU, NCCL 2.8.4); the large rows from microsoft/
  superbenchmark ``tests/benchmarks/micro_benchmarks/test_cuda_nccl_bw_performance.py``
  (8× A100-SXM4, ``-g 8``).
- ``H100``: togethercomputer/together-nccl-tests ``benchmarks/H100/results/20260305_220043/``
  (8× H100 SXM, NCCL 2.26.2, ``-g 8``: its small rows are inflated, no per-process table
  was found); large rows from xxrjun/nccl-tests-cluster ``nccl_N1_G8_cnode3-003.log``
  (8 processes, the default algorithm: its 16 GiB row reaches 482 GB/s, NVLink SHARP's
  figure; a ring alone tops out near 370).
- ``PCIe 3.0``: Anthony-Hoo/Anthony-Hoo.github.io ``posts/AutoDL_Multi-GPU_Interconnection_
  Test.md`` (2× RTX 2080 Ti, PCIe 3.0 x16, no peer-to-peer).
- ``PCIe 5.0``: NVIDIA/nccl-tests#287 (4× RTX 5090, no peer-to-peer: through host memory).
- ``InfiniBand EDR``: aistabci/abci2.0benchmark ``allreduce/inter_vnode/job02.sh.7194532.
  nccl`` (2 nodes × 4 V100, 2× EDR 100 Gb/s per node).
- ``InfiniBand HDR``: aistabci/abci2.0benchmark ``allreduce/inter_anode/job02.sh.7194279.
  nccl`` (2 nodes × 8 A100, 4× HDR 200 Gb/s per node, no SHARP).
- ``InfiniBand NDR``: NVIDIA/nccl-tests#309 (2 nodes × 8 H100, 8× ConnectX-7 400 Gb/s).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Protocol

_US = 1e-6


@dataclass(frozen=True)
class Published:
    """One row of a published ``all_reduce_perf`` table: ranks, bytes, out-of-place µs."""

    ranks: int
    nbytes: float
    time_us: float


class Link(Protocol):
    """What the step model needs of a link: all-reduce seconds, and whether the host waits.

    ``Interconnect`` (NCCL's published curves, this machine's measured one) is one;
    ``segscale.bench.predict.host_staged_link.HostStagedLink`` (GPU ranks under gloo, each
    all-reduce through host memory) is the other.
    """

    @property
    def name(self) -> str:
        """The link's name, as rows and the verdict give it."""
        ...

    @property
    def source(self) -> str:
        """One short line: where the numbers come from."""
        ...

    @property
    def latency(self) -> float:
        """Seconds of the smallest all-reduce."""
        ...

    @property
    def bus_bandwidth(self) -> float:
        """Bytes/s of ring bytes of the largest all-reduce (nccl-tests' ``busbw``)."""
        ...

    @property
    def host_synced(self) -> bool:
        """Whether a blocking collective over this link also makes the host wait for the device."""
        ...

    @property
    def channels(self) -> int:
        """How many collectives it runs at once (each at the full speed of its curve)."""
        ...

    def allreduce_time(self, nbytes: float, n: int) -> float:
        """Seconds of one all-reduce of ``nbytes`` over ``n`` ranks (0.0 for one rank)."""
        ...


@dataclass(frozen=True)
class Interconnect:
    """One link between devices: all-reduce seconds against ring bytes, a curve through points.

    ``points`` are (ring bytes, seconds) pairs in increasing order: published rows for the
    links of ``INTERCONNECTS``, measured ones for "this machine". Between two points the
    time is interpolated linearly in log-log space; below the first it is the first's (the
    latency floor); past the last it grows at the last point's bus bandwidth.
    """

    name: str
    points: tuple[tuple[float, float], ...]
    source: str
    """One short line: where the numbers come from."""

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError(f"points must hold at least one (bytes, seconds) pair for {self.name}")
        for x, t in self.points:
            if not (x > 0 and t > 0 and math.isfinite(x) and math.isfinite(t)):
                raise ValueError(f"points must be positive (bytes, seconds) pairs, got {(x, t)!r}")
        xs = [x for x, _ in self.points]
        if xs != sorted(xs):
            raise ValueError(f"points must be in increasing order of bytes, got {xs!r}")

    @property
    def latency(self) -> float:
        """Seconds of the smallest all-reduce (the latency floor)."""
        return self.points[0][1]

    @property
    def bus_bandwidth(self) -> float:
        """Bytes/s of the largest all-reduce: nccl-tests' ``busbw`` (ring bytes / time)."""
        x, t = self.points[-1]
        return x / t

    @property
    def host_synced(self) -> bool:
        """False: NCCL's collectives (and gloo's between CPU ranks) queue without a host wait."""
        return False

    @property
    def channels(self) -> int:
        """1: a process group's NCCL collectives run in order on one stream."""
        return 1

    def allreduce_time(self, nbytes: float, n: int) -> float:
        """Seconds of one all-reduce of ``nbytes`` over ``n`` ranks (0.0 for one rank)."""
        if not (nbytes >= 0 and math.isfinite(nbytes)):
            raise ValueError(f"nbytes must be >= 0 bytes, got {nbytes!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer number of devices >= 1, got {n!r}")
        if n == 1:
            return 0.0
        x = ring_bytes(nbytes, n)
        first, last = self.points[0], self.points[-1]
        if x <= first[0]:
            return first[1]
        if x >= last[0]:
            return last[1] + (x - last[0]) / self.bus_bandwidth
        index = bisect.bisect_left([p[0] for p in self.points], x)
        (x0, t0), (x1, t1) = self.points[index - 1], self.points[index]
        share = math.log(x / x0) / math.log(x1 / x0)
        return math.exp(math.log(t0) + share * math.log(t1 / t0))


def ring_bytes(nbytes: float, n: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``nbytes`` over ``n`` ranks: 2(n-1)/n."""
    return 2 * (n - 1) / n * nbytes


def from_published(name: str, rows: tuple[Published, ...], source: str) -> Interconnect:
    """The ``Interconnect`` through ``rows``: each row's ring bytes against its time.

    Rows at the same ring bytes (two tables) are averaged; a time below an earlier one
    (noise in the latency floor) is raised to it, so that the curve never falls.
    """
    merged: dict[float, list[float]] = {}
    for row in rows:
        merged.setdefault(ring_bytes(row.nbytes, row.ranks), []).append(row.time_us * _US)
    points: list[tuple[float, float]] = []
    for x in sorted(merged):
        t = sum(merged[x]) / len(merged[x])
        points.append((x, max(t, points[-1][1]) if points else t))
    return Interconnect(name, tuple(points), source)


def _rows(ranks: int, *pairs: tuple[float, float]) -> tuple[Published, ...]:
    return tuple(Published(ranks, nbytes, time_us) for nbytes, time_us in pairs)


_KIB, _MIB, _GIB = 2**10, 2**20, 2**30

PUBLISHED_TABLES: dict[str, tuple[tuple[Published, ...], str]] = {
    "PCIe 3.0 x16": (
        _rows(2, (8, 12.25), (_KIB, 12.10), (64 * _KIB, 40.10), (_MIB, 279.5))
        + _rows(2, (32 * _MIB, 8399.7), (64 * _MIB, 16801), (_GIB, 268588)),
        "2× RTX 2080 Ti, no P2P (Anthony-Hoo.github.io AutoDL test)",
    ),
    "PCIe 5.0 x16": (
        _rows(4, (8, 15.60), (_KIB, 15.88), (64 * _KIB, 32.58), (_MIB, 93.45))
        + _rows(4, (32 * _MIB, 1860.0), (64 * _MIB, 3708.9), (128 * _MIB, 7384.4)),
        "4× RTX 5090, no P2P (NVIDIA/nccl-tests#287)",
    ),
    "NVLink V100": (
        _rows(4, (8, 8.22), (_KIB, 9.47), (64 * _KIB, 22.34), (_MIB, 77.21), (32 * _MIB, 449.9))
        + _rows(8, (32 * _MIB, 550.8), (64 * _MIB, 992.7), (128 * _MIB, 1818.8)),
        "4× V100 NVLink (abci2.0benchmark) + 8× V100 DGX-1 (konnase.github.io)",
    ),
    "NVLink A100": (
        _rows(8, (8, 16.94), (_KIB, 19.83), (64 * _KIB, 40.35), (_MIB, 75.86), (32 * _MIB, 360.6))
        + _rows(8, (64 * _MIB, 584.5), (8 * _GIB, 63896)),
        "8× A100 SXM4 (abci2.0benchmark; superbenchmark test fixture)",
    ),
    "NVLink H100": (
        _rows(8, (8, 35.58), (_KIB, 35.17), (64 * _KIB, 36.24), (_MIB, 42.19))
        + _rows(8, (32 * _MIB, 183.55), (64 * _MIB, 313.73), (16 * _GIB, 62390.4)),
        "8× H100 SXM (together-nccl-tests, -g 8; nccl-tests-cluster, 8 processes)",
    ),
    "InfiniBand EDR": (
        _rows(8, (8, 17.93), (_KIB, 23.33), (64 * _KIB, 53.15), (_MIB, 198.7), (32 * _MIB, 2970.9)),
        "2 nodes × 4 V100, 2× EDR 100 Gb/s per node (abci2.0benchmark)",
    ),
    "InfiniBand HDR": (
        _rows(
            16, (8, 32.62), (_KIB, 36.44), (64 * _KIB, 57.59), (_MIB, 146.5), (32 * _MIB, 1887.3)
        ),
        "2 nodes × 8 A100, 4× HDR 200 Gb/s per node, no SHARP (abci2.0benchmark)",
    ),
    "InfiniBand NDR": (
        _rows(16, (8, 24.70), (_KIB, 29.75), (64 * _KIB, 33.84), (_MIB, 71.93))
        + _rows(16, (32 * _MIB, 267.9), (64 * _MIB, 466.1), (16 * _GIB, 68652)),
        "2 nodes × 8 H100, 8× NDR 400 Gb/s per node (NVIDIA/nccl-tests#309)",
    ),
}
"""Per link: the published rows (ranks, bytes, out-of-place time in µs) and their source."""

INTERCONNECTS: tuple[Interconnect, ...] = tuple(
    from_published(name, rows, source) for name, (rows, source) in PUBLISHED_TABLES.items()
)


def find_interconnect(name: str) -> Interconnect:
    """The row of ``INTERCONNECTS`` called ``name``, compared case-insensitively."""
    wanted = name.strip().casefold()
    for link in INTERCONNECTS:
        if link.name.casefold() == wanted:
            return link
    known = ", ".join(repr(link.name) for link in INTERCONNECTS)
    raise ValueError(f"unknown interconnect {name!r}; expected one of {known}")
