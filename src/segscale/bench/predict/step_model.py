"""Predict data-parallel (PyTorch DDP) step time, speed-up and efficiency from one device.

``bench.py`` measures one device's training step and what the ranks of this machine share
and pay to synchronize; this module turns those into a prediction for N ranks over a given
interconnect (``segscale.bench.predict.interconnects``). It is arithmetic only: the step it starts
from is described in ``segscale.bench.predict.step_profile``, the time of its sync points and of
its backward pass in ``segscale.bench.predict.collective_timing``; here they are summed.

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
  Over a link whose blocking collectives wait on the host (``Link.host_synced``: GPU
  ranks under gloo, ``segscale.bench.predict.host_staged_link``) each of them is a host sync too.
  In the forward pass: synchronized batch norm's collectives (``BatchNormSync``: layers ×
  collectives per layer), and the other collectives on the critical path (the loss
  normaliser's all-reduce between forward and backward; DDP's buffer broadcast).
- *Backward*: synchronized batch norm's backward collectives block the backward pass at
  evenly spaced points; DDP's gradient buckets (``Gradients``: DDP's own bucket sizes, in
  all-reduce order, and when each is ready) are all-reduced asynchronously on the same
  communication stream, first come first served, so a batch-norm collective queued behind
  a large bucket waits for it (over a link with more channels, ``Link.channels``: gloo's
  worker threads, each collective takes the one free first). Only what runs past the end
  of the backward pass is exposed.
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

from dataclasses import asdict, dataclass
from typing import Any

from segscale.bench.predict.collective_timing import (
    backward_pass,
    expected_max_standard_normal,
    sync_point,
)
from segscale.bench.predict.interconnects import Link
from segscale.bench.predict.step_profile import (
    BatchNormSync,
    Collectives,
    Gradients,
    Host,
    StepProfile,
    require_devices,
    require_positive,
)

# predict's defaults (frozen, so one instance serves every call): ranks that share
# nothing and meet at no collective besides batch norm and the gradient buckets.
_UNSHARED_HOST = Host()
_NO_COLLECTIVES = Collectives()


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


def speedup(throughput_n: float, throughput_1: float) -> float:
    """How many times one device's throughput ``throughput_n`` is."""
    require_positive(throughput_n, "throughput_n", "samples/s")
    require_positive(throughput_1, "throughput_1", "samples/s")
    return throughput_n / throughput_1


def efficiency(speedup_value: float, n: int) -> float:
    """Speed-up per device: 1.0 is perfect scaling."""
    require_positive(speedup_value, "speedup_value", "times")
    require_devices(n)
    return speedup_value / n


def predict(
    profile: StepProfile,
    gradients: Gradients,
    n: int,
    link: Link,
    host: Host = _UNSHARED_HOST,
    sync_batchnorm: BatchNormSync | None = None,
    collectives: Collectives = _NO_COLLECTIVES,
    data_rate_1: float | None = None,
    data_rate_n: float | None = None,
) -> Prediction:
    """Predict DDP training on ``n`` ranks over ``link`` from one device's ``profile``.

    ``host`` describes the n ranks (not used for one); ``data_rate_1`` and ``data_rate_n``
    (samples/s one rank's input pipeline delivers with 1 and with ``n`` ranks), when
    given, cap one device's throughput and each of the n ranks'.
    """
    require_devices(n)
    for rate, name in ((data_rate_1, "data_rate_1"), (data_rate_n, "data_rate_n")):
        if rate is not None:
            require_positive(rate, name, "samples/s")
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
    if bn is not None and link.host_synced:  # the host waits for each of its collectives
        per_layer = bn.forward_collectives + bn.backward_collectives
        host_syncs += bn.layers * per_layer * wait * host.host_sync_skew_s
    message = bn.message_bytes if bn is not None else 8.0
    forward_sync = forward_bn * sync_point(message, n, link, host)
    others = sum(sync_point(size, n, link, host) for size in collectives.forward)
    if link.host_synced:
        others += len(collectives.forward) * wait * host.host_sync_skew_s
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
