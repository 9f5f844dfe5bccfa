"""The config keys a relaunch may not change, and how a change to them is found.

Compared with the latest launch record's ``config.yaml`` (values resolved where both
resolve, so an interpolation that gives the same value is no change), these are frozen:

- ``model.*`` but ``model.encoder_weights``: the checkpoint's weights fit this network
  only (``encoder_weights`` only initializes a fresh run; a resume loads the checkpoint).
- ``datamodule.num_classes``, ``class_names``, ``ignore_index``, ``label_ids``,
  ``ignore_ids``: what the output channels and the mask values mean (class colours only
  draw, so they may change).
- ``datamodule.in_channels``, ``mean``, ``std``: the input the weights learned from.
- ``datamodule.batch_size``, ``patch_size``, ``patches_per_image``, ``shuffle``,
  ``sampling.*``, ``seed`` (and ``datamodule.seed``), and the world size (processes ×
  ``trainer.num_nodes``, counted, so ``devices=2`` and ``devices=[0,1]`` are the same):
  a resumed epoch continues the patch sequence and the schedule at the checkpoint's
  step, and both are laid out by these; another value would repeat or skip patches and
  put the schedule elsewhere.
- ``scaling.*`` and ``trainer.accumulate_grad_batches``: the global batch and the
  learning rate the optimizer state was built with, and the steps per epoch.
- ``optimizer._target_`` and ``optimizer.solver``: the checkpoint's optimizer state
  (momentum, moments) belongs to that solver.

Anything else may change: ``trainer.max_epochs``/``max_steps`` (extend a run),
callbacks, loggers, ``num_workers``, data paths, precision, ...
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from segscale.config_schema import plain
from segscale.devices import available_devices, devices_count
from segscale.errors import ConfigError

FROZEN = (
    "model",
    "datamodule.num_classes",
    "datamodule.class_names",
    "datamodule.ignore_index",
    "datamodule.label_ids",
    "datamodule.ignore_ids",
    "datamodule.in_channels",
    "datamodule.mean",
    "datamodule.std",
    "datamodule.batch_size",
    "datamodule.patch_size",
    "datamodule.patches_per_image",
    "datamodule.shuffle",
    "datamodule.sampling",
    "datamodule.seed",
    "seed",
    "scaling",
    "optimizer._target_",
    "optimizer.solver",
    "trainer.accumulate_grad_batches",
)
"""Config keys (and subtrees) that a relaunch may not change; see the module docstring."""
NOT_FROZEN = ("model.encoder_weights",)
"""Keys under ``FROZEN`` subtrees that may change."""
WORLD_SIZE = "world size (trainer.devices × trainer.num_nodes)"
"""How the number of processes is named in the refusal."""
_ABSENT = "<not set>"


def frozen_changes(started: DictConfig, current: DictConfig) -> dict[str, tuple[str, str]]:
    """Each frozen key whose value differs: key → (the record's, this launch's), shown."""
    changes: dict[str, tuple[str, str]] = {}
    raw: dict[str, tuple[Any, Any]] = {}
    for key in FROZEN:
        for leaf in sorted(set(_leaves(started, key)) | set(_leaves(current, key))):
            if leaf in NOT_FROZEN or leaf.startswith(tuple(f"{k}." for k in NOT_FROZEN)):
                continue
            old, new = _value(started, leaf), _value(current, leaf)
            if old != new:
                changes[leaf] = (_shown(old), _shown(new))
                raw[leaf] = (_raw(started, leaf), _raw(current, leaf))
    # A key that only refers to another changed one (model.num_classes:
    # ${datamodule.num_classes}) is not named twice.
    for leaf, (old_raw, new_raw) in raw.items():
        target = _reference(old_raw)
        if old_raw == new_raw and target in changes and target != leaf:
            del changes[leaf]
    old_world, new_world = world_size(started), world_size(current)
    if old_world != new_world:
        changes[WORLD_SIZE] = (f"{old_world} processes", f"{new_world} processes")
    return changes


def world_size(cfg: DictConfig) -> int | str:
    """Processes of the run: ``trainer.devices`` counted on this machine × ``num_nodes``.

    ``devices: -1`` (or ``auto``) counts this machine's devices, for the record too: a
    relaunch on a machine with another number of GPUs is not seen as a change. A value
    that cannot be counted is returned as written.
    """
    try:
        devices = OmegaConf.select(cfg, "trainer.devices")
        accelerator = OmegaConf.select(cfg, "trainer.accelerator", default="auto")
        nodes = OmegaConf.select(cfg, "trainer.num_nodes", default=1)
        return devices_count(devices, available_devices(str(accelerator))) * int(nodes)
    except (ConfigError, OmegaConfBaseException, TypeError, ValueError):
        return repr(OmegaConf.select(cfg, "trainer.devices", throw_on_resolution_failure=False))


def _leaves(cfg: DictConfig, key: str) -> Iterator[str]:
    """The full keys of the values under ``key`` (``key`` itself for a value or a list)."""
    node = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
    if not isinstance(node, DictConfig):
        if OmegaConf.select(cfg, key, default=_ABSENT, throw_on_resolution_failure=False) != (
            _ABSENT
        ):
            yield key
        return
    for child in node:
        yield from _leaves(cfg, key + "." + str(child))


def _value(cfg: DictConfig, key: str) -> Any:
    """``key``'s value, resolved; as written when it does not resolve here (``${hydra:...}``)."""
    try:
        value = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_resolution_failure=True)
    except OmegaConfBaseException:
        return _raw(cfg, key)
    return plain(value)


def _raw(cfg: DictConfig, key: str) -> Any:
    """``key``'s value as written (interpolations unresolved)."""
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if not isinstance(node, DictConfig) or name not in node:
        return _ABSENT
    child = node._get_node(name)  # the node itself, not its resolved value
    if isinstance(child, (DictConfig, ListConfig)):
        return plain(child, resolve=False)
    return child._value() if child is not None else _ABSENT


def _reference(value: Any) -> str | None:
    """The key a plain interpolation (``${datamodule.num_classes}``) refers to."""
    match = re.fullmatch(r"\$\{([\w.]+)\}", value) if isinstance(value, str) else None
    return match.group(1) if match else None


def _shown(value: Any) -> str:
    return value if value == _ABSENT else repr(value)
