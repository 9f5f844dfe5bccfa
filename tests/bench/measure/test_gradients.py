"""DDP's buckets: ours against those a real DDP (a gloo world of one) rebuilds and reports."""

from __future__ import annotations

import pytest
import segmentation_models_pytorch as smp
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from segscale.bench.measure.gradients import ddp_buckets, measure_gradients
from segscale.runs.builders import build, build_datamodule, build_module
from segscale.training.ranks.launch import free_port


@pytest.fixture
def world_of_one():
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_buckets_are_those_ddp_rebuilds(world_of_one):
    torch.manual_seed(0)
    network = smp.DeepLabV3Plus("resnet18", encoder_weights=None, classes=3)
    parameters = list(network.parameters())
    order: list[int] = []
    hooks = [
        p.register_post_accumulate_grad_hook(lambda _, i=i: order.append(i))
        for i, p in enumerate(parameters)
    ]
    image = torch.randn(2, 3, 64, 64)
    network(image).sum().backward()
    for hook in hooks:
        hook.remove()
    ours = [
        sum(parameters[order[j]].numel() * 4 for j in bucket)
        for bucket in ddp_buckets([parameters[i] for i in order])
    ]
    ddp = DistributedDataParallel(network)
    for _ in range(3):  # DDP rebuilds its buckets in the second, reports them in the third
        ddp(image).sum().backward()
    reported = ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]
    assert ours == [int(size) for size in reported.split(", ")]
    assert ours[0] < 2 * 2**20 < ours[1]  # the small first bucket, then 25 MiB ones


def test_measured_gradients_cover_every_parameter_in_ready_order(make_config):
    cfg = make_config()
    effective = build(cfg.scaling).resolve(cfg.datamodule.batch_size, cfg.optimizer.lr, 1)
    datamodule = build_datamodule(cfg, effective)
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader(num_workers=0)))
    module = build_module(cfg, datamodule, effective.learning_rate)
    gradients = measure_gradients(module, batch, "32-true", torch.device("cpu"))
    expected = sum(p.numel() * 4 for p in module.parameters() if p.requires_grad)
    assert gradients.total_bytes == expected
    assert gradients.buckets[0] <= 2 * 2**20
    assert list(gradients.ready) == sorted(gradients.ready)
    assert gradients.ready[0] >= 0.0 and gradients.ready[-1] <= 1.0
    assert all(p.grad is None for p in module.parameters())
