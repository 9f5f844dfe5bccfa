"""The ``bench`` section of ``conf/bench.yaml``: its checks, and the device counts it asks for."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from segscale.bench.pipeline import doubling_counts
from segscale.errors import ConfigError, integer_at_least, require


def device_counts(configured: Any, available: int) -> list[int]:
    """Device counts for the ddp runs: ``configured``, or 1, 2, 4, … and ``available``."""
    if configured:
        counts = sorted({int(n) for n in configured})
        if counts[0] < 1 or counts[-1] > available:
            raise ConfigError(
                f"bench.devices={counts} is not allowed: expected counts from 1 to {available} "
                "(the devices of this machine)"
            )
        return counts
    return doubling_counts(available)


def check_bench(options: DictConfig) -> None:
    """Raise ``ConfigError`` for a ``bench`` value that cannot work."""
    for name, minimum in (
        ("warmup_steps", 0),
        ("window_steps", 1),
        ("windows", 1),
        ("option_steps", 1),
        ("overhead_steps", 1),
        ("overhead_rounds", 1),
    ):
        require(
            options[name],
            f"bench.{name}",
            integer_at_least(minimum),
            f"an integer >= {minimum}",
        )
    for name in ("seconds", "timeout_s", "bucket_mb", "in_memory_gb"):
        require(
            options[name],
            f"bench.{name}",
            lambda v: isinstance(v, (int, float)) and v > 0,
            "a positive number",
        )
    if options.threads_per_process is not None:
        require(
            options.threads_per_process,
            "bench.threads_per_process",
            lambda v: isinstance(v, int) and v >= 1,
            "a positive integer, or null (the cores / the largest device count)",
        )
    require(
        options.predict_devices,
        "bench.predict_devices",
        lambda v: bool(v) and all(isinstance(n, int) and n >= 2 for n in v),
        "a list of device counts >= 2, such as [2, 4, 8]",
    )
