"""When N ranks' collectives end: a blocking sync point, and the backward pass behind them.

A sync point costs the all-reduce of its message and the wait for the latest rank
(``E[max of N standard normals] × Host.skew_s``); in the backward pass, DDP's buckets and
synchronized batch norm's blocking collectives share the link's channels (NCCL's one
communication stream; gloo's two worker threads) (``backward_pass``). The step model
(``segscale.bench.predict.step_model``) sums these terms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from segscale.bench.predict.interconnects import Link
from segscale.bench.predict.step_profile import (
    Gradients,
    Host,
    require_count,
    require_devices,
    require_positive,
)

# Simpson's rule on [-_NORMAL_SPAN, _NORMAL_SPAN]: the integrand of E[max] is below 1e-20
# outside it for any n a node holds, and 4000 intervals put the error far under 1e-6.
_NORMAL_SPAN = 10.0
_NORMAL_INTERVALS = 4000


def expected_max_standard_normal(n: int) -> float:
    """E[max of ``n`` independent standard normals]: 0 for 1, 0.5642 for 2, 1.4236 for 8."""
    require_devices(n)
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


def sync_point(nbytes: float, n: int, link: Link, host: Host) -> float:
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
    link: Link,
    host: Host,
    blocking: int = 0,
    blocking_bytes: float = 8.0,
) -> BackwardResult:
    """Simulate backward compute, ``blocking`` evenly spaced blocking collectives and buckets.

    The link's channels (``Link.channels``: NCCL's one stream, gloo's worker threads)
    serve, first come first served, each bucket once it is ready and each blocking
    collective once compute reaches it, each on the channel free first; compute waits for
    a blocking collective to end. Without ``host.overlap`` everything runs in series.
    """
    require_positive(backward_s, "backward_s", "seconds")
    require_count(blocking, "blocking", 0)
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
    free = [0.0] * link.channels  # when each channel is next free
    now = progress = blocked = 0.0
    for at, kind, size in events:
        now += at - progress
        progress = at
        channel = free.index(min(free))
        start = max(now, free[channel])
        if kind == 1:  # a bucket: compute goes on
            free[channel] = start + link.allreduce_time(size, n)
        else:  # a batch-norm collective: compute waits for it
            free[channel] = start + collective
            blocked += free[channel] - now
            now = free[channel]
    now += backward_s - progress
    last = max(free)
    return BackwardResult(max(now, last), blocked, max(0.0, last - now))
