"""What N ranks on one host cost each other: measured with N processes side by side.

``side_by_side`` starts N processes (a gloo group of N, one CPU "device" each with its
share of the threads) that build the user's network and batch and time, in turn:

1. ``plain``: the bare training step (forward, loss, backward, optimizer), with no
   communication at all. Against the same loop alone (N = 1) it gives the *host
   slowdown*: what the ranks lose to shared cores, caches and memory bandwidth.
2. ``sync_points``: the same step with a blocking all-reduce of a few bytes after every
   batch-norm layer's forward. The extra time over ``plain``, per sync point, is what one
   collective costs where the ranks meet mid-step: the collective's latency and the wait
   for the latest rank.
3. ``sync_batchnorm``: the network with synchronized batch norm (segscale's, as
   ``train.py`` converts it), so the rest of its cost over ``plain``, beyond its
   collectives, is its arithmetic.

No DDP gradient all-reduce runs here: the step model adds it from the measured
all-reduce curve. On GPUs each rank has its own device; this runs on CPUs only.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf
from torch import nn

from segscale.atomic_files import write_text_atomically
from segscale.bench.measure.compute import bare_steps
from segscale.training.ranks.launch import free_port

PHASES = ("plain", "sync_points", "sync_batchnorm")


@dataclass(frozen=True)
class SideBySide:
    """Mean seconds per step of each phase, averaged over the ranks, at ``devices`` ranks."""

    devices: int
    plain_s: float
    sync_points_s: float | None
    sync_batchnorm_s: float | None
    sync_points: int
    """Sync points per step in the ``sync_points`` phase (the batch-norm layers)."""

    def as_dict(self) -> dict[str, Any]:
        """Plain numbers (for ``bench.json``)."""
        return asdict(self)


@dataclass(frozen=True)
class Sharing:
    """The host terms of the step model at N ranks, from ``side_by_side`` at 1 and N."""

    devices: int
    slowdown: float
    """Step time of N loops side by side over one alone."""
    sync_point_s: float
    """Seconds one blocking collective adds where the ranks meet mid-step."""
    sync_batchnorm_compute_s: float
    """Seconds synchronized batch norm adds per step beyond its collectives, at N ranks."""
    alone: SideBySide
    together: SideBySide

    def as_dict(self) -> dict[str, Any]:
        """Plain numbers (for ``bench.json``)."""
        return asdict(self)


def batchnorm_layers(module: nn.Module) -> list[nn.Module]:
    """The batch-norm layers of ``module``, in registration order."""
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _timed_steps(module: Any, batch: dict[str, torch.Tensor], precision: str, plan: tuple) -> float:
    """Mean seconds of bare training steps after warm-up, every rank starting together."""
    warmup, steps = plan
    bare_steps(module, batch, precision, torch.device("cpu"), warmup)
    dist.barrier()
    return statistics.fmean(
        sum(p) for p in bare_steps(module, batch, precision, torch.device("cpu"), steps)
    )


def _rank(
    rank: int, world: int, port: int, config: dict, threads: int, plan: tuple, result: str
) -> None:
    """One process of ``side_by_side``."""
    # Imported here: the spawned process builds the network the way bench.py does.
    from segscale.runs.builders import build, build_datamodule, build_module

    torch.set_num_threads(threads)
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = OmegaConf.create(config)
        torch.manual_seed(cfg.seed + rank)
        effective = build(cfg.scaling).resolve(cfg.datamodule.batch_size, cfg.optimizer.lr, 1)
        datamodule = build_datamodule(cfg, effective)
        datamodule.setup("fit")
        batch = next(iter(datamodule.train_dataloader(num_workers=0)))
        precision = str(cfg.trainer.precision)
        times: dict[str, float | None] = dict.fromkeys(PHASES)
        module = build_module(cfg, datamodule, effective.learning_rate)
        times["plain"] = _timed_steps(module, batch, precision, plan)
        layers = batchnorm_layers(module)
        if world > 1:
            tiny = torch.zeros(2)

            def meet(*_: Any) -> None:
                dist.all_reduce(tiny)

            handles = [layer.register_forward_hook(meet) for layer in layers]
            times["sync_points"] = _timed_steps(module, batch, precision, plan)
            for handle in handles:
                handle.remove()
            synced = build_module(cfg, datamodule, effective.learning_rate, sync_batchnorm=True)
            times["sync_batchnorm"] = _timed_steps(synced, batch, precision, plan)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, times)
        if rank == 0:
            means = {
                phase: (
                    statistics.fmean(g[phase] for g in gathered)
                    if gathered[0][phase] is not None
                    else None
                )
                for phase in PHASES
            }
            write_text_atomically(result, json.dumps(means | {"layers": len(layers)}))
    finally:
        dist.destroy_process_group()


def side_by_side(
    cfg: DictConfig, devices: int, threads: int, warmup: int, steps: int
) -> SideBySide:
    """Run the phases (module docstring) in ``devices`` processes of ``threads`` threads."""
    config = OmegaConf.to_container(cfg, resolve=True)
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "side_by_side.json"
        args = (devices, free_port(), config, threads, (warmup, steps), str(result))
        mp.start_processes(_rank, args=args, nprocs=devices, start_method="spawn")
        means = json.loads(result.read_text(encoding="utf-8"))
    return SideBySide(
        devices,
        means["plain"],
        means["sync_points"],
        means["sync_batchnorm"],
        means["layers"],
    )


def sharing(alone: SideBySide, together: SideBySide) -> Sharing:
    """The host terms from one process alone and N side by side."""
    per_point = 0.0
    if together.sync_points_s is not None and together.sync_points:
        per_point = max(0.0, together.sync_points_s - together.plain_s) / together.sync_points
    extra = 0.0
    if together.sync_batchnorm_s is not None:
        # Segscale's layer meets the other ranks once forward and once backward per layer.
        collectives = 2 * together.sync_points * per_point
        extra = max(0.0, together.sync_batchnorm_s - together.plain_s - collectives)
    return Sharing(
        devices=together.devices,
        slowdown=max(1.0, together.plain_s / alone.plain_s),
        sync_point_s=per_point,
        sync_batchnorm_compute_s=extra,
        alone=alone,
        together=together,
    )
