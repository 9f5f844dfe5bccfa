"""What a sweeper optimizes: one number from a finished job's summary."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig


def optimized_metric(cfg: DictConfig) -> str:
    """The metric a sweeper optimizes: ``optimized_metric``, by default ``val/mIoU``."""
    return str(cfg.get("optimized_metric") or "val/mIoU")


def objective(cfg: DictConfig, summary: dict[str, Any]) -> float | None:
    """The value a sweeper optimizes: the final ``optimized_metric`` of the run."""
    return summary.get("metrics", {}).get(optimized_metric(cfg))
