"""Predict data-parallel (PyTorch DDP) step time, speed-up and efficiency from one device.

``bench.py`` measures one device's training step (forward, backward, optimizer) and the bytes
of gradient it produces; this module turns those into a prediction for N devices over a given
interconnect. It is arithmetic only.

The model
---------
A step on N devices takes

    step_N = forward + backward + optimizer + exposed communication + straggler wait

- *Communication*: DDP all-reduces the gradients (in the parameters' dtype: fp32 for fp32, TF32
  and AMP training, since AMP keeps fp32 parameters) in buckets of ``bucket_cap_mb`` (25 MiB).
  Each bucket is one NCCL ring all-reduce taking 2(n-1)/n · bytes / busbw + 2(n-1) · alpha.
  Gradients are taken to appear at a uniform rate over the backward pass, so a bucket is ready
  when backward has produced its cumulative bytes; buckets go out in order on one stream, each
  starting when it is ready and the previous one is done. Only what runs past the end of the
  backward pass is *exposed*, i.e. adds to the step.
- *Stragglers*: every step ends in a collective, so every rank waits for the slowest. With a
  per-step coefficient of variation ``jitter`` and independent normal step times, that costs
  jitter · step · E[max of n standard normals].
- *Data*: only when a per-device data rate (samples/s the input pipeline delivers) is given,
  throughput is capped at it, for one device as for N.

Left out, so the prediction is an upper bound on efficiency in these respects:

- the data pipeline, unless a rate is given (CPU decoding shared by all ranks of a node);
- NCCL kernels competing with backward kernels for SMs and memory bandwidth while they overlap;
- lower bandwidth for small messages than the large-message busbw used here;
- contention on a network shared with other jobs, and topology beyond one ring;
- hierarchical, tree and NVLink SHARP algorithms NCCL may pick instead of a ring;
- DDP's own costs: the 1 MiB first bucket, copying gradients into buckets, hook overhead,
  buckets of uneven size (a bucket closes at the first parameter that overflows it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from segscale.bench.interconnects import Interconnect

DDP_BUCKET_BYTES = 25 * 2**20
"""torch DDP's ``bucket_cap_mb`` default (25 MiB)."""

# A remainder this small relative to a bucket is float noise from grad_bytes / bucket_bytes,
# not a bucket: counting it would add a whole bucket's ring latency.
_REMAINDER_TOLERANCE = 1e-9

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

    def __post_init__(self) -> None:
        _require_positive(self.forward_s, "forward_s", "seconds")
        _require_positive(self.backward_s, "backward_s", "seconds")
        _require_non_negative(self.optimizer_s, "optimizer_s", "seconds")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"batch must be an integer >= 1 samples, got {self.batch!r}")
        _require_non_negative(self.jitter, "jitter", "(a coefficient of variation)")

    @property
    def step_s(self) -> float:
        """Seconds of one step: forward, backward and optimizer."""
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def throughput(self) -> float:
        """Samples per second of one device."""
        return self.batch / self.step_s


def ring_allreduce_time(nbytes: float, n: int, link: Interconnect) -> float:
    """Seconds of one ring all-reduce of ``nbytes`` over ``n`` devices (0.0 for one device)."""
    _require_positive(nbytes, "nbytes", "bytes")
    _require_devices(n)
    if n == 1:
        return 0.0
    steps = 2 * (n - 1)
    return steps / n * nbytes / link.bus_bandwidth + steps * link.latency


def bucket_sizes(grad_bytes: float, bucket_bytes: float = DDP_BUCKET_BYTES) -> list[float]:
    """Bytes of each DDP bucket, in order: full buckets, then the remainder if any."""
    _require_positive(grad_bytes, "grad_bytes", "bytes")
    _require_positive(bucket_bytes, "bucket_bytes", "bytes")
    full = math.floor(grad_bytes / bucket_bytes)
    remainder = grad_bytes - full * bucket_bytes
    # Also catches a slightly negative remainder, when the quotient rounded up to a whole number.
    if remainder <= _REMAINDER_TOLERANCE * bucket_bytes:
        remainder = 0.0
    sizes = [float(bucket_bytes)] * full
    if remainder > 0:
        sizes.append(remainder)
    return sizes


def exposed_communication(
    profile: StepProfile,
    grad_bytes: float,
    n: int,
    link: Interconnect,
    bucket_bytes: float = DDP_BUCKET_BYTES,
) -> float:
    """Seconds of gradient all-reduce that run past the end of the backward pass.

    Bucket k is ready when backward has produced its cumulative bytes (gradients at a uniform
    rate over ``backward_s``); one stream runs the buckets in order, bucket k starting at
    max(ready_k, end of bucket k-1). 0.0 for one device.
    """
    sizes = bucket_sizes(grad_bytes, bucket_bytes)
    _require_devices(n)
    if n == 1:
        return 0.0
    produced = 0.0
    end = 0.0
    for size in sizes:
        produced += size
        ready = profile.backward_s * produced / grad_bytes
        end = max(ready, end) + ring_allreduce_time(size, n, link)
    return max(0.0, end - profile.backward_s)


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


def straggler_wait(profile: StepProfile, n: int) -> float:
    """Seconds a step waits for the slowest of ``n`` ranks: jitter · step · E[max of n]."""
    _require_devices(n)
    if n == 1:
        return 0.0
    return profile.jitter * profile.step_s * expected_max_standard_normal(n)


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


@dataclass(frozen=True)
class Prediction:
    """The predicted step of ``devices`` data-parallel devices over one interconnect."""

    devices: int
    interconnect: str
    step_s: float
    """Seconds per step: compute + exposed communication + straggler wait."""
    exposed_communication_s: float
    straggler_s: float
    throughput: float
    """Samples/s of all devices together."""
    speedup: float
    """Throughput over one device's throughput."""
    efficiency: float
    """Speed-up over the number of devices."""
    data_bound: bool
    """Whether the data pipeline, not compute + communication, sets the throughput."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (for JSON or a table)."""
        return asdict(self)


def predict(
    profile: StepProfile,
    grad_bytes: float,
    n: int,
    link: Interconnect,
    bucket_bytes: float = DDP_BUCKET_BYTES,
    data_rate_per_device: float | None = None,
) -> Prediction:
    """Predict DDP training on ``n`` devices over ``link`` from one device's ``profile``.

    ``grad_bytes`` is what DDP all-reduces each step (parameters × bytes of their dtype).
    ``data_rate_per_device`` (samples/s one device's input pipeline delivers), when given,
    caps the throughput of one device and of ``n``.
    """
    _require_devices(n)
    if data_rate_per_device is not None:
        _require_positive(data_rate_per_device, "data_rate_per_device", "samples/s")
    exposed = exposed_communication(profile, grad_bytes, n, link, bucket_bytes)
    straggler = straggler_wait(profile, n)
    step = profile.step_s + exposed + straggler
    throughput = n * profile.batch / step
    single = profile.throughput
    data_bound = False
    if data_rate_per_device is not None:
        single = min(single, data_rate_per_device)
        if n * data_rate_per_device < throughput:
            throughput = n * data_rate_per_device
            data_bound = True
    gain = speedup(throughput, single)
    return Prediction(
        devices=n,
        interconnect=link.name,
        step_s=step,
        exposed_communication_s=exposed,
        straggler_s=straggler,
        throughput=throughput,
        speedup=gain,
        efficiency=efficiency(gain, n),
        data_bound=data_bound,
    )
