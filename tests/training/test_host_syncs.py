"""No avoidable host syncs in the training step (docs/architecture.md), counted on CPU.

``HostSyncCounter`` first (what it counts, what it leaves alone), then a training
step of the module on two gloo ranks, then whole steps of real two-rank DDP runs.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from segscale.models.losses import SegmentationLoss
from segscale.models.module import SegmentationModule
from segscale.runs.scaling.sync_batchnorm import convert_sync_batchnorm
from segscale.training.run.training_run import train
from tests.helpers.distributed import on_two_ranks
from tests.helpers.host_sync_window import SIGTERM_PHASE, CountHostSyncs
from tests.helpers.host_syncs import HostSyncCounter


def counted(function) -> dict[str, dict[str, int]]:
    with HostSyncCounter() as counter:
        function()
    return counter.as_dict()


def test_reading_a_value_on_the_host_counts():
    x = torch.randn(4)

    def reads() -> None:
        x.sum().item()
        float(x.sum())
        int(x.argmax())
        if x.sum() > 100:  # bool(tensor)
            pass
        torch.equal(x, x)
        torch.allclose(x, x)

    assert counted(reads) == {
        "step": {"aten._local_scalar_dense": 4, "aten.equal": 1, "aten.allclose": 1}
    }


def test_copies_to_the_host_count():
    x = torch.randn(4)
    assert counted(lambda: (x.cpu(), x.tolist(), x.numpy())) == {
        "step": {"Tensor.cpu": 1, "Tensor.tolist": 1, "Tensor.numpy": 1}
    }


def test_data_dependent_shapes_count():
    x = torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0, 6.0])  # several masked values, not random
    mask = x > 0

    def data_dependent() -> None:
        x[mask]
        x.nonzero()
        torch.masked_select(x, mask)
        torch.unique(x)
        torch.repeat_interleave(x, torch.arange(6))
        torch.bincount(torch.arange(3))
        torch.nn.functional.one_hot(torch.arange(3))  # num_classes from the data
        x.clone()[mask] = x[mask] * 2  # several values: no masked_fill_

    counts = counted(data_dependent)["step"]
    assert counts == {
        "aten.index": 2,
        "aten.nonzero": 1,
        "aten.masked_select": 1,
        "aten._unique2": 1,
        "aten.repeat_interleave": 1,
        "aten.bincount": 1,
        "aten.one_hot": 1,
        "aten.index_put_": 1,
    }


def test_what_needs_no_host_leaves_no_count():
    x = torch.randn(6)
    mask = x > 0

    def device_only() -> None:
        x[torch.tensor([0, 2])]  # integer indices
        torch.where(mask, x, 0.0)
        x.clone()[mask] = 0.0  # a number: masked_fill_ on a GPU
        x.nonzero_static(size=6)
        torch.repeat_interleave(x, 2)
        torch.nn.functional.one_hot(torch.arange(3), 3)  # CPU-only range checks
        torch.nn.utils.clip_grad_norm_([nn.Parameter(x.clone())], 1.0)
        (x / x.sum().clamp(min=1)).sum()

    assert counted(device_only) == {}


class _NonzeroInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad.nonzero()
        return grad * 2


def test_the_backward_pass_is_seen():
    x = torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0, 6.0], requires_grad=True)
    with HostSyncCounter() as counter:
        selected = x[x.detach() > 0]  # boolean-mask indexing: its backward syncs as well
        loss = selected.sum() + _NonzeroInBackward.apply(x).sum()
        with counter.in_phase("backward"):
            loss.backward()
    assert counter.as_dict() == {
        "step": {"aten.index": 1},
        "backward": {"aten.index_put": 1, "aten.nonzero": 1},
    }


def test_phases_split_the_counts():
    x = torch.randn(3)
    with HostSyncCounter("forward") as counter:
        x.sum().item()
        with counter.in_phase("optimizer"):
            x.max().item()
            x.min().item()
        counter.phase = "after"
        x.nonzero()
    assert counter.as_dict() == {
        "forward": {"aten._local_scalar_dense": 1},
        "optimizer": {"aten._local_scalar_dense": 2},
        "after": {"aten.nonzero": 1},
    }
    assert counter.total("optimizer") == 2 and counter.total() == 4
    assert counter.total("missing") == 0
    x.sum().item()  # outside: not counted
    assert counter.total() == 4


class PixelBatchNorm(nn.Module):
    """Convolution, batch norm, convolution: the module's network in small."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, classes, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _module_step_on_rank(rank: int) -> dict[str, Any]:
    """One step of the module with every avoidable sync's source on: counts per phase."""
    torch.manual_seed(0)
    loss = SegmentationLoss(3, class_weights=[0.5, 2.0, 1.0], focal=0.5)
    seg = SegmentationModule(
        convert_sync_batchnorm(PixelBatchNorm()),
        partial(torch.optim.SGD, lr=0.1),
        3,
        ["a", "b", "c"],
        loss=loss,
        gradient_threshold=0.01,
        gradient_threshold_method="l2norm",
    )
    optimizer = torch.optim.SGD(seg.parameters(), lr=0.1)
    seg.trainer = SimpleNamespace(
        world_size=2,
        global_step=1,
        log_every_n_steps=10,
        precision="32-true",
        optimizers=[optimizer],
    )
    seg.log = lambda *args, **kwargs: None
    generator = torch.Generator().manual_seed(rank)
    mask = torch.randint(0, 3, (2 + rank, 8, 8), generator=generator)
    mask[:, 0] = 255
    image = torch.randint(0, 256, (2 + rank, 3, 8, 8), generator=generator, dtype=torch.uint8)
    with HostSyncCounter() as counter:
        for _ in range(2):  # the second step reads the first's verdict, the only host read
            seg.training_step({"image": image, "mask": mask}, 0).backward()
            with counter.in_phase("optimizer"):
                seg.on_before_optimizer_step(optimizer)
                optimizer.step()
                optimizer.zero_grad()
    return counter.as_dict()


def _collectives_on_rank(rank: int) -> dict[str, Any]:
    with HostSyncCounter() as counter:
        tensor = torch.ones(3)
        dist.all_reduce(tensor)
        dist.broadcast(tensor, src=0)
        dist.all_gather([torch.empty(3), torch.empty(3)], tensor)
        dist.barrier()
    return counter.as_dict()


def _on_each_rank(rank: int) -> dict[str, Any]:
    return {"module": _module_step_on_rank(rank), "collectives": _collectives_on_rank(rank)}


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict[str, Any]]:
    return on_two_ranks(_on_each_rank)


def test_collectives_do_not_count_but_a_barrier_does(ranks):
    # NCCL queues collectives on a stream; a barrier waits for the device.
    for rank in range(2):
        assert ranks[rank]["collectives"] == {"step": {"c10d.barrier": 1}}


def test_a_module_step_syncs_once_inside_the_optimizer_step(ranks):
    """Synchronized batch norm, class weights and per-parameter clipping: over two steps,
    one host read, of the first step's non-finite verdict, inside the second's optimizer
    step (on CUDA from pinned memory, a step after the device wrote it)."""
    for rank in range(2):
        assert ranks[rank]["module"] == {"optimizer": {"Tensor.tolist": 1}}


# The whole per-step path of real runs: Lightning's loop, logging, callbacks, DDP.
# Every config trains on two gloo ranks (ddp_spawn) with the shipped callbacks and the
# shipped log_every_n_steps (10): step 1 (after one warm-up step) is not one whose
# metrics are written, so nothing in it needs a value on the host but the non-finite
# check inside the optimizer step: the read of step 0's verdict (a step old: on CUDA
# from pinned host memory, tests/gpu/test_gpu_tier.py counts 0 syncs there).
# Two runs (a DDP run costs ~12 s of spawned processes): the shipped default as it is,
# and every other path at once. A host read that class weights or the gradient
# threshold adds is in the second run's counts as it would be in a run of its own.
CONFIGS = {
    "default": [],  # the default: training.sync_batchnorm=true
    "sync_batchnorm_off+class_weights+gradient_threshold": [
        "training.sync_batchnorm=false",
        "loss.class_weights=[1.0,2.0,1.0,1.0,2.0,0.5]",
        "training.gradient_threshold=0.5",
    ],
}


def count_one_step(make_config, folder: Path, *overrides: str) -> dict[int, dict]:
    """Train 3 steps of the real config, counting step 1's syncs: ``{rank: counts}``."""
    train(
        make_config(
            "trainer.log_every_n_steps=10",
            "datamodule.patches_per_image=16",  # 4 steps an epoch (8 with one process)
            "trainer.max_steps=3",
            "callbacks.validation_report=null",
            "+callbacks.host_syncs._target_=tests.helpers.host_sync_window.CountHostSyncs",
            "+callbacks.host_syncs.step=1",
            f"+callbacks.host_syncs.folder={folder}",
            *overrides,
        )
    )
    return CountHostSyncs.read(folder)


def assert_one_sync_inside_the_optimizer_step(counts: dict[str, dict[str, int]]) -> None:
    assert counts.get("step", {}) == {}
    assert counts["optimizer"] == {"Tensor.tolist": 1}
    # Lightning 2.6 broadcasts rank 0's SIGTERM flag and reads it with item() before
    # every step under DDP (Lightning-AI/pytorch-lightning#21487), outside our code.
    assert counts.get(SIGTERM_PHASE, {}) in ({}, {"aten._local_scalar_dense": 1})


def test_a_training_step_of_one_process_syncs_only_inside_the_optimizer_step(make_config, tmp_path):
    counts = count_one_step(make_config, tmp_path / "syncs")
    assert set(counts) == {0}
    assert_one_sync_inside_the_optimizer_step(counts[0])


@pytest.mark.slow
@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_ddp_training_step_syncs_only_inside_the_optimizer_step(make_config, tmp_path, config):
    folder = tmp_path / "syncs"
    counts = count_one_step(
        make_config, folder, "strategy=ddp_spawn", "trainer.devices=2", *CONFIGS[config]
    )
    assert set(counts) == {0, 1}
    for rank_counts in counts.values():
        assert_one_sync_inside_the_optimizer_step(rank_counts)
