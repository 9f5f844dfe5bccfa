"""World-size rules: the batch per device and the learning rate that N devices use.

MATLAB's advice for several GPUs is to keep the batch per GPU and grow the global batch
with their number, and to grow the learning rate with the global batch; Goyal et al.
(2017) add a gradual warmup. These rules do that arithmetic, explicitly and logged,
instead of leaving it to the user.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from segscale.checks import ConfigError

BATCH_MODES = ("per_device", "global")
LR_RULES = ("none", "linear", "sqrt")


@dataclass(frozen=True)
class Effective:
    """The values a run actually uses on ``world_size`` devices."""

    world_size: int
    per_device_batch_size: int
    global_batch_size: int
    learning_rate: float
    lr_scale: float
    warmup_epochs: float

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
    """

    def __init__(
        self,
        batch: str = "per_device",
        lr: str = "none",
        base_batch_size: int = 8,
        warmup_epochs: float | None = None,
    ) -> None:
        if batch not in BATCH_MODES:
            raise ConfigError(
                f"scaling.batch={batch!r} is unknown: expected one of {list(BATCH_MODES)}"
            )
        if lr not in LR_RULES:
            raise ConfigError(f"scaling.lr={lr!r} is unknown: expected one of {list(LR_RULES)}")
        if not (isinstance(base_batch_size, int) and base_batch_size >= 1):
            raise ConfigError(
                f"scaling.base_batch_size={base_batch_size!r} is not allowed: expected the "
                "global batch size optimizer.lr was chosen for (an integer >= 1)"
            )
        if warmup_epochs is not None and warmup_epochs < 0:
            raise ConfigError(
                f"scaling.warmup_epochs={warmup_epochs!r} is not allowed: expected >= 0"
            )
        self.batch, self.lr, self.base_batch_size = batch, lr, base_batch_size
        self.warmup_epochs = warmup_epochs

    def resolve(self, batch_size: int, learning_rate: float, world_size: int) -> Effective:
        """The per-device batch, global batch, learning rate and warmup for ``world_size``."""
        if self.batch == "per_device":
            per_device, global_batch = batch_size, batch_size * world_size
        else:
            if batch_size % world_size:
                raise ConfigError(
                    f"datamodule.batch_size={batch_size} with scaling.batch=global cannot be split "
                    f"evenly over {world_size} devices; expected a multiple of {world_size}"
                )
            per_device, global_batch = batch_size // world_size, batch_size
        ratio = global_batch / self.base_batch_size
        scale = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[self.lr]
        warmup = self.warmup_epochs
        if warmup is None:
            warmup = 1.0 if scale > 1 else 0.0
        return Effective(world_size, per_device, global_batch, learning_rate * scale, scale, warmup)
