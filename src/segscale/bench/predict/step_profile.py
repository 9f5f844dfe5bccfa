"""A data-parallel training step as the step model (``segscale.bench.predict.step_model``) sees it.

What one device's step measured (``StepProfile``), what DDP all-reduces and when
(``Gradients``), synchronized batch norm's collectives (``BatchNormSync``), what the
ranks of one host share (``Host``), and the other blocking collectives (``Collectives``).

The model is arithmetic on measured numbers; a zero, negative or non-finite one would
give a prediction that looks like any other, so each of its constructors and functions
refuses it with a ``ValueError`` naming the argument and its value (``require_positive``,
``require_non_negative``, ``require_count``, ``require_devices``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DDP_BUCKET_BYTES = 25 * 2**20
"""torch DDP's ``bucket_cap_mb`` default (25 MiB)."""

DDP_FIRST_BUCKET_BYTES = 2**20
"""torch DDP's first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``, 1 MiB)."""

SYNC_BATCHNORM_COLLECTIVES: dict[str, tuple[int, int, int]] = {
    "segscale": (1, 1, 0),  # segscale.runs.scaling.sync_batchnorm: one all-reduce each way
    # nn.SyncBatchNorm of PyTorch 1.6 (the published rows): all_gather of the statistics,
    # one host sync (``if size == 1`` on a device tensor), all_reduce in backward. Today's
    # version syncs the host three times per layer (boolean masks over empty ranks).
    "torch-1.6": (1, 1, 1),
    "paddle": (1, 1, 0),  # paddle.nn.SyncBatchNorm: all-reduce each way, in the kernel
}
"""Per implementation: collectives per layer forward, backward, and host syncs per layer."""


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
        require_positive(self.forward_s, "forward_s", "seconds")
        require_positive(self.backward_s, "backward_s", "seconds")
        require_non_negative(self.optimizer_s, "optimizer_s", "seconds")
        require_count(self.batch, "batch", 1)
        require_non_negative(self.jitter, "jitter", "(a coefficient of variation)")
        require_non_negative(self.overhead_s, "overhead_s", "seconds")

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
            require_positive(size, "buckets", "bytes")
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
            require_positive(size, "sizes", "bytes")
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
        require_count(self.layers, "layers", 0)
        require_positive(self.message_bytes, "message_bytes", "bytes")
        require_count(self.forward_collectives, "forward_collectives", 0)
        require_count(self.backward_collectives, "backward_collectives", 0)
        require_count(self.host_syncs, "host_syncs", 0)
        require_non_negative(self.compute_s, "compute_s", "seconds")


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
        require_non_negative(self.skew_s, "skew_s", "seconds")
        require_non_negative(self.host_sync_skew_s, "host_sync_skew_s", "seconds")


@dataclass(frozen=True)
class Collectives:
    """The blocking collectives of a step besides batch norm: their message bytes."""

    forward: tuple[float, ...] = field(default_factory=tuple)

    @classmethod
    def ddp(cls, buffer_bytes: float, normaliser_bytes: float = 16.0) -> Collectives:
        """DDP's buffer broadcast (when the network has buffers) and the loss normaliser."""
        return cls(((buffer_bytes,) if buffer_bytes > 0 else ()) + (normaliser_bytes,))


def require_positive(value: float, name: str, unit: str) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number above 0."""
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number of {unit}, got {value!r}")


def require_non_negative(value: float, name: str, unit: str) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number of at least 0."""
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be >= 0 {unit}, got {value!r}")


def require_count(value: int, name: str, minimum: int) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def require_devices(n: int, name: str = "n") -> None:
    """Raise ``ValueError`` unless ``n`` is a number of devices: an integer of at least 1."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be an integer number of devices >= 1, got {n!r}")
