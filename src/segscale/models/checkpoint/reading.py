"""Reading a checkpoint in one pass: open and verify, parse its record, build the network.

Every reader of a ``train.py`` checkpoint (resume, ``model.init_from``, predict,
evaluate, export, bench and the Python API) comes through here:

1. ``files.load_checkpoint_file``: read weights-only (nothing in the file can run
   code) and verified against the digest written with it, once;
2. ``record.parse_record``: its ``segscale`` entry checked and typed
   (``CheckpointRecord``);
3. ``network.trained_network``: the network its record describes, built without
   Hydra, with its weights, which must fit exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from segscale.errors import ConfigError
from segscale.models.checkpoint.files import load_checkpoint_file
from segscale.models.checkpoint.network import network_weights, trained_network
from segscale.models.checkpoint.record import ENTRY, CheckpointRecord, parse_record
from segscale.models.weights import StateMismatch, compare_state


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint file's verified content and its parsed record."""

    path: Path
    content: dict[str, Any]
    """Everything the file holds (``state_dict``, optimizer and loop states, ...)."""
    record: CheckpointRecord | None
    """``None`` only where the caller allowed a checkpoint without one."""

    def network_weights(self, key: str) -> dict[str, Any]:
        """The network's weights (``state_dict`` entries without their ``network.`` prefix).

        ``key`` names the config key that gave the file, for the refusal of one without a
        ``state_dict``.
        """
        state = self.content.get("state_dict")
        if not isinstance(state, dict):
            raise ConfigError(
                f"{key}={str(self.path)!r} has no state_dict; expected a .ckpt from train.py"
            )
        return network_weights(state)

    def state_mismatch(self, expected: Mapping[str, torch.Tensor]) -> StateMismatch:
        """How the checkpoint's whole ``state_dict`` differs from a module's (``expected``)."""
        return compare_state(expected, self.content.get("state_dict") or {})


def read_checkpoint(path: str | Path, key: str, record_required: bool = True) -> Checkpoint:
    """The checkpoint at ``path``, verified, with its record checked and parsed.

    ``key`` names the config key that gave ``path``, for error messages. A checkpoint
    without a ``segscale`` entry is refused unless ``record_required`` is false (a
    resume of a module that was built without one).
    """
    path = Path(path)
    content = load_checkpoint_file(path, key)
    meta = content.get(ENTRY)
    if meta is None and not record_required:
        return Checkpoint(path, content, None)
    return Checkpoint(path, content, parse_record(meta, path, key))


def read_trained_network(path: str | Path, key: str = "ckpt") -> tuple[nn.Module, CheckpointRecord]:
    """The network of a ``train.py`` checkpoint with its weights, and its record.

    ``key`` names the config key that gave ``path``, for error messages.
    """
    checkpoint = read_checkpoint(path, key)
    record = checkpoint.record
    assert record is not None  # record_required
    weights = checkpoint.network_weights(key)
    return trained_network(record.model, weights, checkpoint.path, key), record
