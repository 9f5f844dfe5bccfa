"""Links between devices, described by what a ring all-reduce over them reaches.

The prediction model (``segscale.bench.prediction``) needs two numbers per link:

- the *bus bandwidth* a large NCCL ring all-reduce reaches: ``busbw`` in nccl-tests, which
  folds the ring's 2(n-1)/n traffic factor into the figure so that it can be set against one
  link's speed (nccl-tests, doc/PERFORMANCE.md);
- a latency per ring step (alpha); a ring all-reduce over n ranks takes 2(n-1) steps.

The bandwidths are *achieved* figures, not line rates from data sheets: packet headers and
NCCL's own protocol cost 10-25 % of a link. Peaks are per direction, per GPU.

==============  ============  ===========  =======  =========================================
name            peak per dir  busbw used   latency  reasoning
==============  ============  ===========  =======  =========================================
PCIe 3.0 x16    15.75 GB/s    12 GB/s      6 µs     ~75 % of the link (1)
PCIe 4.0 x16    31.5 GB/s     24 GB/s      6 µs     ~75 % of the link (1)
PCIe 5.0 x16    63 GB/s       48 GB/s      6 µs     ~75 % of the link (1)
NVLink V100     150 GB/s      130 GB/s     4 µs     DGX-1V hybrid cube mesh, 6 NVLink2 (2)
NVLink A100     300 GB/s      230 GB/s     4 µs     DGX A100, 12 NVLink3 + NVSwitch (3)
NVLink H100     450 GB/s      370 GB/s     4 µs     DGX/HGX H100, 18 NVLink4 + NVSwitch (4)
InfiniBand HDR  25 GB/s       23.5 GB/s    10 µs    200 Gb/s, one NIC per GPU (5)
InfiniBand NDR  50 GB/s       46 GB/s      10 µs    400 Gb/s, one NIC per GPU (5)
==============  ============  ===========  =======  =========================================

(1) Estimate. Best case: GPUs that reach each other through one PCIe switch with peer-to-peer
    enabled. Rings through the CPU's root complex, or across sockets, often get half of this or
    less (NVIDIA/nccl#445: 4.9 GB/s busbw on a PCIe box; NVIDIA/nccl#1639: 8 PCIe 5.0 GPUs,
    28 GB/s, "determined by the bandwidth your CPU and memory can deliver").
(2) Estimate: ~130 GB/s is the figure commonly quoted for a DGX-1V (NVIDIA's NCCL talks); no
    stored nccl-tests log was checked.
(3) nccl-tests issues report 200-210 GB/s on 8 A100 SXM4 boards (NVIDIA/nccl-tests#149, #178);
    230 GB/s is the upper end, a tuned DGX A100.
(4) NVIDIA/nccl-tests#212 (NCCL maintainer): "NCCL can get an effective NVLink bandwidth of
    370GB/s" with NCCL_ALGO=RING. NVLink SHARP (NVLS, the default all-reduce on H100) shows
    ~480 GB/s busbw, but it is not a ring, which is what this model describes.
(5) Estimate: ~92-94 % of the line rate; NVIDIA/nccl-tests#119 (A100 nodes with 4 HDR NICs)
    reached 85-96 % of theirs. With one NIC per GPU the ring's bottleneck is the NIC, so its
    rate is the bus bandwidth; every ring step is charged the network latency, which
    over-counts it when most hops are NVLink inside a node.

Latencies are estimates: NVIDIA/nccl#583 shows a 32-byte all-reduce on 2 A100s taking ~10 µs
(two ring steps plus a kernel launch); PCIe and the network add a few µs each. At 25 MiB a
bucket they barely matter; they do for many small buckets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_GB = 1e9
_US = 1e-6


@dataclass(frozen=True)
class Interconnect:
    """One link between devices, as a ring all-reduce sees it."""

    name: str
    bus_bandwidth: float
    """Bytes/s a large NCCL ring all-reduce reaches ("busbw" of nccl-tests)."""
    latency: float
    """Seconds per ring step (alpha)."""
    source: str
    """One short line: where the numbers come from."""

    def __post_init__(self) -> None:
        if not (self.bus_bandwidth > 0 and math.isfinite(self.bus_bandwidth)):
            raise ValueError(
                f"bus_bandwidth must be a positive number of bytes/s, got {self.bus_bandwidth!r}"
            )
        if not (self.latency >= 0 and math.isfinite(self.latency)):
            raise ValueError(f"latency must be >= 0 seconds, got {self.latency!r}")


INTERCONNECTS: tuple[Interconnect, ...] = (
    Interconnect(
        "PCIe 3.0 x16", 12 * _GB, 6 * _US, "estimate: ~75 % of 15.75 GB/s, GPUs on one switch"
    ),
    Interconnect(
        "PCIe 4.0 x16", 24 * _GB, 6 * _US, "estimate: ~75 % of 31.5 GB/s, GPUs on one switch"
    ),
    Interconnect(
        "PCIe 5.0 x16", 48 * _GB, 6 * _US, "estimate: ~75 % of 63 GB/s, GPUs on one switch"
    ),
    Interconnect(
        "NVLink V100", 130 * _GB, 4 * _US, "estimate: busbw quoted for DGX-1V (NCCL talks)"
    ),
    Interconnect(
        "NVLink A100", 230 * _GB, 4 * _US, "nccl-tests#149/#178 report 200-210; DGX A100 ~230"
    ),
    Interconnect(
        "NVLink H100", 370 * _GB, 4 * _US, "nccl-tests#212: ring busbw ~370 GB/s (NVLS ~480)"
    ),
    Interconnect(
        "InfiniBand HDR", 23.5 * _GB, 10 * _US, "estimate: ~94 % of 25 GB/s, one NIC per GPU"
    ),
    Interconnect(
        "InfiniBand NDR", 46 * _GB, 10 * _US, "estimate: ~92 % of 50 GB/s, one NIC per GPU"
    ),
)


def find_interconnect(name: str) -> Interconnect:
    """The row of ``INTERCONNECTS`` called ``name``, compared case-insensitively."""
    wanted = name.strip().casefold()
    for link in INTERCONNECTS:
        if link.name.casefold() == wanted:
            return link
    known = ", ".join(repr(link.name) for link in INTERCONNECTS)
    raise ValueError(f"unknown interconnect {name!r}; expected one of {known}")
