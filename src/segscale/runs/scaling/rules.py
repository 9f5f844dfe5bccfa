"""World-size rules: the batch per device and the learning rate that N devices use.

MATLAB's advice for several GPUs is to keep the batch per GPU and grow the global batch
with their number, and to grow the learning rate with the global batch; Goyal et al.
(2017) add a gradual warmup. These rules do that arithmetic, explicitly and logged,
instead of leaving it to the user. ``worker_load`` is MATLAB's ``WorkerLoad``: uneven
devices get uneven shares of the global batch, and a device of weight 0 is left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from segscale.data.sampling.loaders import split_in_proportion
from segscale.errors import ConfigError


@dataclass(frozen=True)
class Effective:
    """The values a run actually uses on ``world_size`` devices.

    ``included`` lists the positions (in ``trainer.devices`` order, over all nodes) of
    the devices that train: all of them, unless ``scaling.worker_load`` gives some a
    weight of 0. ``per_device_batch_sizes`` has one entry per included device.
    """

    world_size: int
    per_device_batch_sizes: tuple[int, ...]
    global_batch_size: int
    learning_rate: float
    lr_scale: float
    warmup_epochs: float
    included: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)


class ScalingRules:
    """How ``datamodule.batch_size`` and ``optimizer.lr`` change with the world size.

    ``batch``: ``per_device`` (``datamodule.batch_size`` on every device, so the global
    batch grows with N) or ``global`` (``datamodule.batch_size`` is the global batch,
    split evenly across devices). ``lr``: ``none`` keeps ``optimizer.lr``; ``linear`` and
    ``sqrt`` multiply it by ``global / base_batch_size`` or its square root.
    ``warmup_epochs`` ramps the rate up linearly over that many epochs; ``null`` means 1
    epoch whenever the rule raises the rate, else none.

    ``worker_load`` (one non-negative weight per device) makes the shares uneven: with
    ``per_device`` a device of weight ``w`` gets ``round(w · batch_size)``; with
    ``global`` the global batch is split in proportion to the weights (rounded by
    largest remainder). A weight of 0 leaves the device out of the run.
    """

    def __init__(
        self,
        batch: str = "per_device",
        lr: str = "none",
        base_batch_size: int = 8,
        warmup_epochs: float | None = None,
        worker_load: Sequence[float] | None = None,
    ) -> None:
        # Each value's kind and range is the schema's (segscale.config_schema) to check.
        if worker_load is not None:
            worker_load = [float(w) for w in worker_load]
        self.batch = batch
        self.lr = lr
        self.base_batch_size = base_batch_size
        self.warmup_epochs = warmup_epochs
        self.worker_load = worker_load

    def resolve(self, batch_size: int, learning_rate: float, world_size: int) -> Effective:
        """The per-device batches, global batch, learning rate and warmup for ``world_size``."""
        weights = self.worker_load or [1.0] * world_size
        if len(weights) != world_size:
            raise ConfigError(
                f"scaling.worker_load has {len(weights)} weights but the run has {world_size} "
                "devices (trainer.devices × trainer.num_nodes); expected one weight per device"
            )
        included = tuple(r for r, w in enumerate(weights) if w > 0)
        active = [weights[r] for r in included]
        if self.batch == "per_device":
            per_device = [round(w * batch_size) for w in active]
        else:
            # Equal weights must split evenly; uneven ones are rounded by largest remainder.
            if len(set(active)) == 1 and batch_size % len(active):
                raise ConfigError(
                    f"datamodule.batch_size={batch_size} with scaling.batch=global cannot be split "
                    f"evenly over {len(active)} devices; expected a multiple of {len(active)}"
                )
            per_device = split_in_proportion(batch_size, active)
        if min(per_device) < 1:
            raise ConfigError(
                f"scaling.worker_load={weights} with datamodule.batch_size={batch_size} gives "
                f"the devices batches of {per_device}; every device with a positive weight "
                "needs at least 1: raise the batch size or the small weights"
            )
        global_batch = sum(per_device)
        ratio = global_batch / self.base_batch_size
        scale = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[self.lr]
        warmup = self.warmup_epochs
        if warmup is None:
            warmup = 1.0 if scale > 1 else 0.0
        return Effective(
            len(included),
            tuple(per_device),
            global_batch,
            learning_rate * scale,
            scale,
            warmup,
            included,
        )
