"""Values callbacks read from the running trainer."""

from __future__ import annotations

import lightning as L


def logged_metric(trainer: L.Trainer, key: str) -> float | None:
    """The value of ``key`` the module last logged (``None`` before it is logged)."""
    value = trainer.callback_metrics.get(key)
    return None if value is None else float(value)


def current_learning_rate(trainer: L.Trainer) -> float:
    """The learning rate of the first parameter group now."""
    return float(trainer.optimizers[0].param_groups[0]["lr"])
