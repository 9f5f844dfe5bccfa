"""DDP's gradient buckets for the user's network, and when the backward pass fills each.

DDP all-reduces gradients in buckets: after its first iteration it rebuilds them in the
order the backward pass produced the gradients, the first bucket closing at 1 MiB
(``dist._DEFAULT_FIRST_BUCKET_BYTES``) and the rest at ``bucket_cap_mb`` (25 MiB), with
torch's own ``dist._compute_bucket_assignment_by_size`` (a private function: it is what
DDP calls, so the buckets here are DDP's, not an imitation; the tests compare them with
those a real DDP reports). ``measure_gradients`` runs a backward pass (after a warm-up
one) with a hook on every parameter, so the order is the real one and each bucket's
ready time is measured. On a GPU the hooks fire when the host queues a gradient, which
runs ahead of the device: there the ready times are those of the queue, an estimate.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from segscale.bench.measure.compute import forward_loss
from segscale.bench.measure.timing import synchronize
from segscale.bench.predict.step_profile import DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, Gradients


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def ddp_buckets(
    parameters: list[torch.Tensor],
    first_cap: int = DDP_FIRST_BUCKET_BYTES,
    cap: int = DDP_BUCKET_BYTES,
) -> list[list[int]]:
    """Indices into ``parameters`` (in gradient order) of each bucket, as DDP forms them."""
    buckets, _ = dist._compute_bucket_assignment_by_size(parameters, [first_cap, cap])
    return [list(bucket) for bucket in buckets]


def measure_gradients(
    module: Any,
    batch: dict[str, torch.Tensor],
    precision: str,
    device: torch.device,
    cap: int = DDP_BUCKET_BYTES,
) -> Gradients:
    """DDP's buckets of ``module`` and the fraction of backward after which each is ready."""
    module = module.to(device).train()
    parameters = [p for p in module.parameters() if p.requires_grad]
    order: list[tuple[int, float]] = []
    hooks = [
        p.register_post_accumulate_grad_hook(lambda _, i=i: order.append((i, time.perf_counter())))
        for i, p in enumerate(parameters)
    ]

    def backward() -> tuple[float, float]:
        loss = forward_loss(module, batch, precision, device)
        synchronize(device)
        start = time.perf_counter()
        loss.backward()
        synchronize(device)
        return start, time.perf_counter()

    try:
        backward()  # warm-up: lazy initialisation and autotuning are not a step's
        order.clear()
        module.zero_grad(set_to_none=True)
        start, end = backward()
    finally:
        for hook in hooks:
            hook.remove()
        module.zero_grad(set_to_none=True)
    produced = {index: at for index, at in order}
    ordered = [index for index, _ in order]
    ordered += [i for i in range(len(parameters)) if i not in produced]  # unused: at the end
    buckets = ddp_buckets([parameters[i] for i in ordered], cap=cap)
    sizes, ready = [], []
    for bucket in buckets:
        members = [ordered[j] for j in bucket]
        sizes.append(float(sum(_nbytes(parameters[i]) for i in members)))
        last = max(produced.get(i, end) for i in members)
        ready.append(min(1.0, max(0.0, (last - start) / (end - start))))
    for i in range(1, len(ready)):  # a bucket is all-reduced after the one before it
        ready[i] = max(ready[i], ready[i - 1])
    return Gradients(tuple(sizes), tuple(ready))


def buffer_bytes(module: torch.nn.Module) -> int:
    """Bytes of the module's buffers: what DDP broadcasts from rank 0 every forward."""
    return sum(b.numel() * b.element_size() for b in module.buffers())
