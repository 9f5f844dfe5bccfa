"""Checks on a composed config that stop a run before anything is built.

Each failure names the config key, the value it got and what is allowed, so a user can
fix the override without reading code.
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and what is allowed."""


EXIT_BAD_INPUT = 2
"""Exit status of every entry point that refuses a bad value, file or folder."""


def check_config(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for the first value in ``cfg`` that cannot work."""
    devices_count(cfg.trainer.get("devices", "auto"))
    for key in ("datamodule.num_classes", "model.num_classes"):
        require(_get(cfg, key), key, lambda v: isinstance(v, int) and v >= 2, "an integer >= 2")
    for key, minimum in (
        ("datamodule.patch_size", 1),
        ("datamodule.patches_per_image", 1),
        ("datamodule.batch_size", 1),
    ):
        value = _get(cfg, key)
        require(
            value,
            key,
            lambda v, m=minimum: isinstance(v, int) and v >= m,
            f"an integer >= {minimum}",
        )
    check_loader_options(cfg)
    # Imported here: these modules import ConfigError from this one.
    from segscale.config_types import check_types
    from segscale.data.samplers import SHUFFLE_MODES
    from segscale.models.nonfinite import check_policy
    from segscale.training.optim import SOLVERS

    shuffle = _get(cfg, "datamodule.shuffle")
    require(
        shuffle, "datamodule.shuffle", lambda v: v in SHUFFLE_MODES, f"one of {list(SHUFFLE_MODES)}"
    )

    solver = _get(cfg, "optimizer.solver")
    require(solver, "optimizer.solver", lambda v: v in SOLVERS, f"one of {list(SOLVERS)}")
    lr = _get(cfg, "optimizer.lr")
    require(
        lr,
        "optimizer.lr",
        lambda v: isinstance(v, (int, float)) and 0 < v < math.inf,
        "a positive learning rate such as 0.01",
    )
    check_policy(OmegaConf.select(cfg, "training.on_nonfinite", default="stop"))
    # Last, so that the checks above give their more specific messages first.
    # model.in_channels: null means "from the images"; train() fills it in when it builds.
    check_types(cfg, filled_in=("model.in_channels",))


def check_loader_options(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for a DataLoader or speed option that cannot work."""
    workers = _get(cfg, "datamodule.num_workers")
    if workers != "auto":
        require(
            workers,
            "datamodule.num_workers",
            lambda v: isinstance(v, int) and v >= 0,
            "an integer >= 0, or 'auto' (the rank's share of the CPU cores)",
        )
    prefetch = OmegaConf.select(cfg, "datamodule.prefetch_factor", default=2)
    require(
        prefetch,
        "datamodule.prefetch_factor",
        lambda v: isinstance(v, int) and v >= 1,
        "an integer >= 1",
    )
    for key, allowed in (
        ("datamodule.persistent_workers", (True, False)),
        ("datamodule.pin_memory", (True, False, None)),
        ("training.channels_last", (True, False)),
        ("training.compile", (True, False)),
    ):
        value = OmegaConf.select(cfg, key, default=False)
        if not any(value is option for option in allowed):
            expected = " or ".join({True: "true", False: "false", None: "null"}[o] for o in allowed)
            raise ConfigError(f"{key}={value!r} is not allowed: expected {expected}")


def is_device_list(devices: Any) -> bool:
    """Whether ``trainer.devices`` lists device indices (``[0, 2]``) rather than a count."""
    return isinstance(devices, (list, tuple, ListConfig))


def devices_count(devices: Any, available: int | None = None, key: str = "trainer.devices") -> int:
    """Number of devices that ``trainer.devices`` (or ``key``) asks for on this node.

    Accepts a positive count, ``-1`` or ``"auto"`` (all ``available``), or a list of
    distinct device indices such as ``[0, 2]``, as Lightning does.
    """
    expected = "a positive count, -1 or 'auto' (all devices), or a list of indices such as [0,2]"
    if is_device_list(devices):
        indices = list(devices)
        ok = indices and all(isinstance(i, int) and i >= 0 for i in indices)
        require(devices, key, lambda _: ok and len(set(indices)) == len(indices), expected)
        return len(indices)
    if devices in ("auto", -1, "-1"):
        return max(1, available or 1)
    if isinstance(devices, str) and devices.isdigit():
        devices = int(devices)
    require(devices, key, lambda v: isinstance(v, int) and v >= 1, expected)
    return devices


def _get(cfg: DictConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if part not in node:
            raise ConfigError(f"{dotted} is missing from the config")
        node = node[part]
    return node


def require(value: Any, key: str, ok: Any, expected: str) -> None:
    """Raise ``ConfigError`` naming ``key`` unless ``ok(value)`` (a bool is never allowed)."""
    if isinstance(value, bool) or not ok(value):
        shown = list(value) if isinstance(value, ListConfig) else value
        raise ConfigError(f"{key}={shown!r} is not allowed: expected {expected}")
