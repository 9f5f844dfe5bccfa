"""Predict data-parallel (PyTorch DDP) step time, speed-up and efficiency from one device.

``bench.py`` measures one device's training step and what the ranks of this machine share
and pay to synchronize; this module turns those into a prediction for N ranks over a given
interconnect (``segscale.bench.interconnects``). It is arithmetic only.

The model
---------
A step on N ranks takes

    step_N = compute × host slowdown + framework overhead
           + forward sync points + backward (with its sync points and gradient buckets)
           + straggler wait

- *Compute* is one device's forward, backward and optimizer (and the extra arithmetic of
  a synchronized batch norm), multiplied by ``Host.slowdown``: what N ranks sharing one
  host lose to each other with no communication at all (on CPU devices: cores, memory
  bandwidth; measured by running N independent loops side by side). GPUs each compute
  alone: 1.0.
- *Framework overhead* is the fixed host cost per step (Lightning, callbacks, logging),
  measured on a near-zero-compute network; it does not shrink with a faster device.
- A *sync point* is a collective every rank must reach before any goes on: each costs the
  all-reduce time of its message (``Interconnect.allreduce_time``) plus the wait for the
  latest rank, ``E[max of N standard normals] × Host.skew_s``, where ``skew_s`` is the
  spread of the ranks' arrival times. A *host sync* (the host waiting for the device, as
  PyTorch 1.6's ``SyncBatchNorm`` did once per layer) is a sync point whose spread is the
  host's, ``Host.host_sync_skew_s``: the rank's host process must itself be there.
  In the forward pass: synchronized batch norm's collectives (``BatchNormSync``: layers ×
  collectives per layer), and the other collectives on the critical path (the loss
  normaliser's all-reduce between forward and backward; DDP's buffer broadcast).
- *Backward*: synchronized batch norm's backward collectives block the backward pass at
  evenly spaced points; DDP's gradient buckets (``Gradients``: DDP's own bucket sizes, in
  all-reduce order, and when each is ready) are all-reduced asynchronously on the same
  communication stream, first come first served, so a batch-norm collective queued behind
  a large bucket waits for it. Only what runs past the end of the backward pass is exposed.
  Where communication cannot overlap compute (``Host.overlap`` False: CPU ranks, whose
  cores run both), every collective adds its whole time.
- *Stragglers*: the step ends in a collective, so every rank waits for the slowest: with a
  per-step coefficient of variation ``jitter``, ``jitter × compute × E[max of N]``.
- *Data*: the per-rank data rate at N ranks (the DataLoader workers ``train.py`` gives each
  rank at N, on the cores they share) caps the throughput, as the 1-rank rate caps one.

Left out: NCCL kernels competing with backward kernels for SMs and memory bandwidth;
contention with other jobs on a shared network; a latency that grows with the rank count
(the curves' floors are those of their tables).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from segscale.bench.interconnects import Interconnect

DDP_BUCKET_BYTES = 25 * 2**20
"""torch DDP's ``bucket_cap_mb`` default (25 MiB)."""

DDP_FIRST_BUCKET_BYTES = 2**20
"""torch DDP's first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``, 1 MiB)."""

SYNC_BATCHNORM_COLLECTIVES: dict[str, tuple[int, int, int]] = {
    "segscale": (1, 1, 0),  # segscale.training.scaling.sync_batchnorm: one all-reduce each way
    # nn.SyncBatchNorm of PyTorch 1.6 (the published rows): all_gather of the statistics,
    # one host sync (``if size == 1`` on a device tensor), all_reduce in backward. Today's
    # version syncs the host three times per layer (boolean masks over empty ranks).
    "torch-1.6": (1, 1, 1),
    "paddle": (1, 1, 0),  # paddle.nn.SyncBatchNorm: all-reduce each way, in the kernel
}
"""Per implementation: collectives per layer forward, backward, and host syncs per layer."""

# Simpson's rule on [-_NORMAL_SPAN, _NORMAL_SPAN]: the integrand of E[max] is below 1e-20
# outside it for any n a node holds, and 4000 intervals put the error far under 1e-6.
_NORMAL_SPAN = 10.0
_NORMAL_INTERVALS = 4000


def _require_positive(value: float, name: str, unit: str) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number of {unit}, got {value!r}")


def _require_non_negative(value: float, name: str, unit: str) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be >= 0 {unit}, got {value!r}")


def _require_count(value: int, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _require_devices(n: int, name: str = "n") -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be an integer number of devices >= 1, got {n!r}")


@dataclass(frozen=True)
class StepProfile:
    """One device's training step, measured: what the prediction starts from."""

    forward_s: float
    """Seconds of the forward pass and the loss."""
    backward_s: float
    """Seconds of the backward pass."""
    optimizer_s: float
    """Seconds of the optimizer step and zero_grad (may be 0 when too short to measure)."""
    batch: int
    """Samples per device per step."""
    jitter: float = 0.0
    """Coefficient of variation of the step time (std / mean)."""
    overhead_s: float = 0.0
    """Fixed host seconds per step of the framework (callbacks, logging, bookkeeping)."""

    def __post_init__(self) -> None:
        _require_positive(self.forward_s, "forward_s", "seconds")
        _require_positive(self.backward_s, "backward_s", "seconds")
        _require_non_negative(self.optimizer_s, "optimizer_s", "seconds")
        _require_count(self.batch, "batch", 1)
        _require_non_negative(self.jitter, "jitter", "(a coefficient of variation)")
        _require_non_negative(self.overhead_s, "overhead_s", "seconds")

    @property
    def compute_s(self) -> float:
        """Seconds of forward, backward and optimizer."""
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def step_s(self) -> float:
        """Seconds of one step on one device: compute and the framework's overhead."""
        return self.compute_s + self.overhead_s

    @property
    def throughput(self) -> float:
        """Samples per second of one device."""
        return self.batch / self.step_s


@dataclass(frozen=True)
class Gradients:
    """What DDP all-reduces each step: its buckets, in order, and when each is ready.

    ``ready`` is the fraction of the backward pass after which a bucket's last gradient
    exists (measured with gradient hooks, or ``uniform``'s estimate).
    """

    buckets: tuple[float, ...]
    """Bytes of each bucket, in the order DDP all-reduces them."""
    ready: tuple[float, ...]
    """Fraction of the backward pass at which each bucket is ready, in [0, 1], increasing."""

    def __post_init__(self) -> None:
        if not self.buckets or len(self.buckets) != len(self.ready):
            raise ValueError(
                f"buckets must be non-empty and as many as ready, got "
                f"{len(self.buckets)} and {len(self.ready)}"
            )
        for size in self.buckets:
            _require_positive(size, "buckets", "bytes")
        if any(not 0 <= r <= 1 for r in self.ready) or list(self.ready) != sorted(self.ready):
            raise ValueError(f"ready must be increasing fractions in [0, 1], got {self.ready!r}")

    @property
    def total_bytes(self) -> float:
        """Bytes of gradient in all."""
        return sum(self.buckets)

    @classmethod
    def uniform(
        cls,
        sizes: list[float],
        first_cap: float = DDP_FIRST_BUCKET_BYTES,
        cap: float = DDP_BUCKET_BYTES,
    ) -> Gradients:
        """DDP's buckets of gradients ``sizes`` (bytes, in the order backward produces them).

        A bucket closes once it holds ``first_cap`` (the first) or ``cap`` bytes, with the
        gradient that reached the limit, as ``dist._compute_bucket_assignment_by_size``
        does; the gradients are taken to appear at a uniform rate in bytes.
        """
        if not sizes:
            raise ValueError("sizes must list at least one gradient")
        buckets: list[float] = []
        current, limit = 0.0, first_cap
        for size in sizes:
            _require_positive(size, "sizes", "bytes")
            current += size
            if current >= limit:
                buckets.append(current)
                current, limit = 0.0, cap
        if current:
            buckets.append(current)
        total, produced, ready = sum(buckets), 0.0, []
        for size in buckets:
            produced += size
            ready.append(min(1.0, produced / total))
        return cls(tuple(buckets), tuple(ready))


@dataclass(frozen=True)
class BatchNormSync:
    """Synchronized batch norm as the step model sees it: its layers and collectives."""

    layers: int
    """Batch-norm layers in the network."""
    message_bytes: float
    """Bytes of one layer's collective (per-channel statistics: small)."""
    forward_collectives: int = 1
    """Collectives per layer in the forward pass."""
    backward_collectives: int = 1
    """Collectives per layer in the backward pass."""
    host_syncs: int = 0
    """Host syncs per layer (``SYNC_BATCHNORM_COLLECTIVES``: PyTorch 1.6's ``SyncBatchNorm`` 1)."""
    compute_s: float = 0.0
    """Extra seconds of arithmetic per step over plain batch norm, on one device."""

    def __post_init__(self) -> None:
        _require_count(self.layers, "layers", 0)
        _require_positive(self.message_bytes, "message_bytes", "bytes")
        _require_count(self.forward_collectives, "forward_collectives", 0)
        _require_count(self.backward_collectives, "backward_collectives", 0)
        _require_count(self.host_syncs, "host_syncs", 0)
        _require_non_negative(self.compute_s, "compute_s", "seconds")


@dataclass(frozen=True)
class Host:
    """What the N ranks of one host share and how they meet at a sync point."""

    slowdown: float = 1.0
    """Step-time factor of N independent loops side by side over one alone (GPUs: 1.0)."""
    overlap: bool = True
    """Whether communication runs beside the backward pass (GPUs) or on its cores (CPUs)."""
    skew_s: float = 0.0
    """Standard deviation of a rank's arrival at a collective, in seconds."""
    host_sync_skew_s: float = 0.0
    """Standard deviation of a rank's arrival at a host sync, in seconds."""

    def __post_init__(self) -> None:
        if not (self.slowdown >= 1.0 and math.isfinite(self.slowdown)):
            raise ValueError(f"slowdown must be a factor >= 1, got {self.slowdown!r}")
        _require_non_negative(self.skew_s, "skew_s", "seconds")
        _require_non_negative(self.host_sync_skew_s, "host_sync_skew_s", "seconds")


def expected_max_standard_normal(n: int) -> float:
    """E[max of ``n`` independent standard normals]: 0 for 1, 0.5642 for 2, 1.4236 for 8."""
    _require_devices(n)
    if n == 1:
        return 0.0
    # E[max] = integral of x · n φ(x) Φ(x)^(n-1) dx, the density of the maximum times x.
    h = 2 * _NORMAL_SPAN / _NORMAL_INTERVALS
    total = 0.0
    for i in range(_NORMAL_INTERVALS + 1):
        x = -_NORMAL_SPAN + i * h
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        cdf = 0.5 * math.erfc(-x / math.sqrt(2))
        weight = 1 if i in (0, _NORMAL_INTERVALS) else (4 if i % 2 else 2)
        total += weight * x * n * pdf * cdf ** (n - 1)
    return total * h / 3


def sync_point(nbytes: float, n: int, link: Interconnect, host: Host) -> float:
    """Seconds of one blocking collective of ``nbytes``: the all-reduce and the latest rank."""
    return link.allreduce_time(nbytes, n) + expected_max_standard_normal(n) * host.skew_s


@dataclass(frozen=True)
class BackwardResult:
    """The backward pass on N ranks: its end, and the part of it that is communication."""

    end_s: float
    """Seconds from the start of backward until compute and every all-reduce are done."""
    sync_batchnorm_s: float
    """Seconds the backward pass is blocked in batch-norm collectives."""
    exposed_gradient_s: float
    """Seconds of gradient all-reduce past the end of backward compute."""


def backward_pass(
    backward_s: float,
    gradients: Gradients,
    n: int,
    link: Interconnect,
    host: Host,
    blocking: int = 0,
    blocking_bytes: float = 8.0,
) -> BackwardResult:
    """Simulate backward compute, ``blocking`` evenly spaced blocking collectives and buckets.

    One communication stream serves, first come first served, each bucket once it is
    ready and each blocking collective once compute reaches it; compute waits for a
    blocking collective to end. Without ``host.overlap`` everything runs in series.
    """
    _require_positive(backward_s, "backward_s", "seconds")
    _require_count(blocking, "blocking", 0)
    if n == 1:
        return BackwardResult(backward_s, 0.0, 0.0)
    collective = sync_point(blocking_bytes, n, link, host)
    if not host.overlap:
        blocked = blocking * collective
        gradient = sum(link.allreduce_time(size, n) for size in gradients.buckets)
        return BackwardResult(backward_s + blocked + gradient, blocked, gradient)
    events = [
        (r * backward_s, 1, size)
        for r, size in zip(gradients.ready, gradients.buckets, strict=True)
    ]
    events += [((j + 1) / (blocking + 1) * backward_s, 0, 0.0) for j in range(blocking)]
    events.sort()
    now = progress = comm_free = blocked = 0.0
    for at, kind, size in events:
        now += at - progress
        progress = at
        start = max(now, comm_free)
        if kind == 1:  # a bucket: compute goes on
            comm_free = start + link.allreduce_time(size, n)
        else:  # a batch-norm collective: compute waits for it
            comm_free = start + collective
            blocked += comm_free - now
            now = comm_free
    now += backward_s - progress
    return BackwardResult(max(now, comm_free), blocked, max(0.0, comm_free - now))


@dataclass(frozen=True)
class Prediction:
    """The predicted step of ``devices`` data-parallel ranks over one interconnect."""

    devices: int
    interconnect: str
    step_s: float
    """Seconds per step, the sum of the terms below."""
    compute_s: float
    """Forward, backward and optimizer, slowed by what the ranks share."""
    overhead_s: float
    """The framework's fixed host cost per step."""
    sync_batchnorm_s: float
    """Synchronized batch norm: collectives, host syncs, waits, its extra arithmetic."""
    collectives_s: float
    """Other collectives on the critical path (loss normaliser, buffer broadcast)."""
    exposed_communication_s: float
    """Gradient all-reduce past the end of the backward pass."""
    straggler_s: float
    """Waiting for the slowest rank at the end of the step."""
    throughput: float
    """Samples/s of all ranks together."""
    speedup: float
    """Throughput over one device's throughput."""
    efficiency: float
    """Speed-up over the number of devices."""
    data_bound: bool
    """Whether the data pipeline, not compute + communication, sets the throughput."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (for JSON or a table)."""
        return asdict(self)


@dataclass(frozen=True)
class Collectives:
    """The blocking collectives of a step besides batch norm: their message bytes."""

    forward: tuple[float, ...] = field(default_factory=tuple)

    @classmethod
    def ddp(cls, buffer_bytes: float, normaliser_bytes: float = 16.0) -> Collectives:
        """DDP's buffer broadcast (when the network has buffers) and the loss normaliser."""
        return cls(((buffer_bytes,) if buffer_bytes > 0 else ()) + (normaliser_bytes,))


def speedup(throughput_n: float, throughput_1: float) -> float:
    """How many times one device's throughput ``throughput_n`` is."""
    _require_positive(throughput_n, "throughput_n", "samples/s")
    _require_positive(throughput_1, "throughput_1", "samples/s")
    return throughput_n / throughput_1


def efficiency(speedup_value: float, n: int) -> float:
    """Speed-up per device: 1.0 is perfect scaling."""
    _require_positive(speedup_value, "speedup_value", "times")
    _require_devices(n)
    return speedup_value / n


def predict(
    profile: StepProfile,
    gradients: Gradients,
    n: int,
    link: Interconnect,
    host: Host = Host(),
    sync_batchnorm: BatchNormSync | None = None,
    collectives: Collectives = Collectives(),
    data_rate_1: float | None = None,
    data_rate_n: float | None = None,
) -> Prediction:
    """Predict DDP training on ``n`` ranks over ``link`` from one device's ``profile``.

    ``host`` describes the n ranks (not used for one); ``data_rate_1`` and ``data_rate_n``
    (samples/s one rank's input pipeline delivers with 1 and with ``n`` ranks), when
    given, cap one device's throughput and each of the n ranks'.
    """
    _require_devices(n)
    for rate, name in ((data_rate_1, "data_rate_1"), (data_rate_n, "data_rate_n")):
        if rate is not None:
            _require_positive(rate, name, "samples/s")
    single = profile.throughput if data_rate_1 is None else min(profile.throughput, data_rate_1)
    if n == 1:
        step = profile.step_s
        throughput = min(profile.batch / step, single)
        return Prediction(
            1, link.name, step, profile.compute_s, profile.overhead_s, 0.0, 0.0, 0.0, 0.0,
            throughput, speedup(throughput, single), 1.0, throughput < profile.batch / step,
        )  # fmt: skip
    bn = sync_batchnorm if sync_batchnorm and sync_batchnorm.layers else None
    slow = host.slowdown
    wait = expected_max_standard_normal(n)
    forward_bn = backward_blocking = 0
    host_syncs = bn_compute = 0.0
    if bn is not None:
        forward_bn = bn.layers * bn.forward_collectives
        backward_blocking = bn.layers * bn.backward_collectives
        host_syncs = bn.layers * bn.host_syncs * wait * host.host_sync_skew_s
        bn_compute = bn.compute_s * slow
    message = bn.message_bytes if bn is not None else 8.0
    forward_sync = forward_bn * sync_point(message, n, link, host)
    others = sum(sync_point(size, n, link, host) for size in collectives.forward)
    backward = backward_pass(
        profile.backward_s * slow, gradients, n, link, host, backward_blocking, message
    )
    compute = profile.compute_s * slow
    terms = {
        "compute_s": compute,
        "overhead_s": profile.overhead_s,
        "sync_batchnorm_s": bn_compute + host_syncs + forward_sync + backward.sync_batchnorm_s,
        "collectives_s": others,
        "exposed_communication_s": backward.exposed_gradient_s,
        "straggler_s": profile.jitter * (compute + bn_compute) * wait,
    }
    return from_terms(n, link.name, profile.batch, terms, single, data_rate_n)


STEP_TERMS = (
    "compute_s",
    "overhead_s",
    "sync_batchnorm_s",
    "collectives_s",
    "exposed_communication_s",
    "straggler_s",
)
"""The terms of ``Prediction`` whose sum is the step on N ranks (the module docstring)."""


def from_terms(
    n: int,
    interconnect: str,
    batch: int,
    terms: dict[str, float],
    single: float,
    data_rate_n: float | None = None,
) -> Prediction:
    """The prediction whose step is the sum of ``terms`` (``STEP_TERMS``, in seconds).

    ``single`` is one device's throughput (samples/s); ``data_rate_n`` caps each rank's.
    The one place where the step is summed: a test replaces a term here to show that the
    published rows would catch a model without it.
    """
    step = sum(terms[name] for name in STEP_TERMS)
    throughput = n * batch / step
    data_bound = data_rate_n is not None and n * data_rate_n < throughput
    if data_bound:
        throughput = n * data_rate_n  # type: ignore[operator]
    gain = speedup(throughput, single)
    return Prediction(
        devices=n,
        interconnect=interconnect,
        step_s=step,
        throughput=throughput,
        speedup=gain,
        efficiency=efficiency(gain, n),
        data_bound=data_bound,
        **terms,
    )
