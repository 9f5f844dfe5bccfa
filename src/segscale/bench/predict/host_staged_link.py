"""GPU ranks under gloo: every all-reduce goes through host memory, and what that costs.

gloo has no path between GPUs on a machine without GPUDirect (every Windows machine):
for CUDA tensors torch's ``ProcessGroupGloo`` (``AsyncAllreduceCUDAHostWork`` in
``torch/csrc/distributed/c10d/ProcessGroupGlooCuda.cpp``) copies each tensor into pinned
host memory on a side stream, all-reduces the host copies between the processes with
gloo's CPU algorithm (over TCP, loopback on one machine), then copies the result back:
three parts, one after the other. An all-reduce of ``b`` bytes over ``n`` ranks takes

    b / D2H + host all-reduce(b, n) + b / H2D

with D2H and H2D the pinned copy bandwidths of the GPU's link to the host, and the host
all-reduce gloo's between CPU processes (bench measures it so: the same algorithm over
the same transport, ``segscale.bench.measure.ddp_runs.measure_allreduce`` without CUDA).

What the step model takes from that code besides the time:

- The work is queued, not waited for: the copies run on a side stream and the host
  all-reduce on one of gloo's worker threads, so DDP's gradient buckets are all-reduced
  beside the backward pass as NCCL's are, and only what runs past its end is exposed.
  A process group has two worker threads by default (``ProcessGroupGloo``'s
  ``Options.threads``), taking the queued collectives in order, each the next that is
  free: the link's two ``channels``, so a batch-norm collective in the backward pass runs
  beside a bucket instead of behind it. The model runs each at the measured speed of
  one all-reduce alone; two large buckets at once share the host's bandwidth, so where
  they meet it understates their time.
- Waiting for it blocks the host: ``Work::wait`` returns once gloo's thread has run the
  host all-reduce, which waited for the device-to-host copy, which waited for everything
  queued on the device before it. So every blocking collective (synchronized batch
  norm's, the loss normaliser's, DDP's buffer broadcast) is a host sync under gloo, as
  PyTorch 1.6's ``SyncBatchNorm`` made one per layer (``HostStagedLink.host_synced``).

Which backend a config's GPU ranks use (``gpu_backend``): NCCL exists on Linux only
(WSL2 is Linux), so on Windows DDP's GPU ranks all-reduce over gloo, through host
memory; on Linux they do when the config asks for gloo
(``strategy.process_group_backend=gloo``). bench predicts gloo's link where the ranks
would use it, and NCCL's beside it (what Linux or WSL2 would give).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from segscale.bench.predict.interconnects import Interconnect
from segscale.bench.predict.step_profile import Gradients, require_count, require_positive
from segscale.devices import process_group_backend
from segscale.platforms import platform_name

NAME = "gloo through host memory"

GLOO_THREADS = 2
"""Worker threads of a gloo process group: ``ProcessGroupGloo.Options``' default (torch 2.14)."""


@dataclass(frozen=True)
class PinnedCopies:
    """A GPU's copies to and from pinned host memory: bytes/s each way, and their source."""

    device_to_host: float
    host_to_device: float
    source: str

    def __post_init__(self) -> None:
        require_positive(self.device_to_host, "device_to_host", "bytes/s")
        require_positive(self.host_to_device, "host_to_device", "bytes/s")


@dataclass(frozen=True)
class HostStagedLink:
    """GPU ranks' all-reduce under gloo: copy to the host, gloo's host all-reduce, copy back."""

    host: Interconnect
    """gloo's all-reduce between CPU processes of the host (measured)."""
    copies: PinnedCopies
    """The GPU's copies to and from pinned host memory."""
    channels: int = GLOO_THREADS
    """gloo's worker threads: collectives run at once (module docstring)."""
    name: str = NAME

    def __post_init__(self) -> None:
        require_count(self.channels, "channels", 1)

    @property
    def source(self) -> str:
        """Where the host all-reduce and the copies come from, in one line."""
        return f"host all-reduce: {self.host.source}; copies: {self.copies.source}"

    @property
    def latency(self) -> float:
        """Seconds of the smallest all-reduce: the host's floor (a few bytes copy in no time)."""
        return self.host.latency

    @property
    def bus_bandwidth(self) -> float:
        """Ring bytes / time of the host's largest all-reduce with its copies, at 2 ranks."""
        x = self.host.points[-1][0]  # at 2 ranks a ring all-reduce's ring bytes are its bytes
        return x / self.allreduce_time(x, 2)

    @property
    def host_synced(self) -> bool:
        """True: waiting for gloo's CUDA all-reduce waits for the device (module docstring)."""
        return True

    def parts(self, nbytes: float, n: int) -> dict[str, float]:
        """Seconds of each part of one all-reduce of ``nbytes`` over ``n`` ranks (0 for one)."""
        if n == 1:
            return {"device_to_host_s": 0.0, "host_allreduce_s": 0.0, "host_to_device_s": 0.0}
        return {
            "device_to_host_s": nbytes / self.copies.device_to_host,
            "host_allreduce_s": self.host.allreduce_time(nbytes, n),
            "host_to_device_s": nbytes / self.copies.host_to_device,
        }

    def allreduce_time(self, nbytes: float, n: int) -> float:
        """Seconds of one all-reduce of ``nbytes`` over ``n`` ranks: its three parts in series."""
        self.host.allreduce_time(nbytes, n)  # its checks of nbytes and n
        return sum(self.parts(nbytes, n).values())

    def gradient_parts(self, gradients: Gradients, n: int) -> dict[str, float]:
        """Each part summed over DDP's buckets: what a step's gradients spend in each."""
        totals = dict.fromkeys(("device_to_host_s", "host_allreduce_s", "host_to_device_s"), 0.0)
        for size in gradients.buckets:
            for key, seconds in self.parts(size, n).items():
                totals[key] += seconds
        return totals

    def as_dict(self) -> dict[str, object]:
        """The link's numbers (for bench.json)."""
        return {
            "name": self.name,
            "device_to_host": self.copies.device_to_host,
            "host_to_device": self.copies.host_to_device,
            "copies_source": self.copies.source,
            "host_latency": self.host.latency,
            "host_bus_bandwidth": self.host.bus_bandwidth,
            "host_source": self.host.source,
        }


def measure_copies(device: torch.device, nbytes: int, repeats: int = 5) -> PinnedCopies:
    """The copies of ``nbytes`` between ``device`` and pinned host memory: medians of ``repeats``.

    As gloo makes them: a GPU tensor into a pinned one (``non_blocking``) and back, each
    timed from a synchronized device to the copy's end.
    """
    elements = max(1, nbytes // 4)
    on_device = torch.ones(elements, device=device)
    pinned = torch.empty(elements, pin_memory=True)

    def median_s(copy: Callable[[], object]) -> float:
        samples = []
        for i in range(repeats + 1):  # the first: the copy engines' and the driver's setup
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            copy()
            torch.cuda.synchronize(device)
            if i:
                samples.append(time.perf_counter() - start)
        return statistics.median(samples)

    size = elements * 4
    to_host = median_s(lambda: pinned.copy_(on_device, non_blocking=True))
    to_device = median_s(lambda: on_device.copy_(pinned, non_blocking=True))
    name = torch.cuda.get_device_name(device)
    return PinnedCopies(
        size / to_host,
        size / to_device,
        f"pinned copies of {size / 2**20:.0f} MiB measured on this {name}",
    )


KEY = "strategy.process_group_backend"


@dataclass(frozen=True)
class GpuBackend:
    """The backend of the GPU ranks, and why it is that one (for the verdict)."""

    name: str
    """``nccl`` or ``gloo``."""
    reason: str
    """Why, in a few words: the platform, or the config key that chose it."""


def gpu_backend(value: object, platform: str | None = None) -> GpuBackend:
    """The backend GPU ranks use with ``strategy.process_group_backend=value`` on ``platform``.

    The choice and its checks are training's (``segscale.platforms.parallel``,
    through ``segscale.devices.process_group_backend``), so bench predicts the backend
    its ddp runs and the user's own runs take, for CUDA GPUs whatever this machine has:
    null is NCCL on Linux, gloo elsewhere; a backend the platform lacks, or anything but
    ``nccl`` and ``gloo``, raises ``ConfigError`` naming the key. ``platform`` defaults
    to ``sys.platform``.
    """
    platform = sys.platform if platform is None else platform
    name = process_group_backend(value, "cuda", KEY, platform)
    if value is not None:
        return GpuBackend(name, f"{KEY}={name}")
    if name == "nccl":
        return GpuBackend(name, "NCCL on Linux")
    return GpuBackend(name, f"{platform_name(platform)} has no NCCL")
