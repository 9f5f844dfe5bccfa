"""The network a checkpoint holds: built from its record, its weights loaded exactly.

The record's ``model`` config is built without Hydra (``network_from_record``), and the
checkpoint's weights must then fit the network key for key and shape for shape
(``load_network_weights``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from segscale.errors import ConfigError
from segscale.models.networks import build_network
from segscale.models.weights import compare_state

PREFIX = "network."
"""The prefix of the network's weights in a checkpoint's ``state_dict`` (the module's)."""


BUILD_NETWORK = f"{build_network.__module__}.{build_network.__qualname__}"
"""The ``_target_`` of the network config that ``train.py`` stores."""


def network_from_record(model_cfg: dict[str, Any], path: Path, key: str) -> nn.Module:
    """The network a checkpoint's ``model`` config describes, built without Hydra.

    Hydra's ``instantiate`` would call whatever ``_target_`` names, reached through any
    module's attributes (``segscale.models.weights.torch.load``, say), and resolve
    interpolations: a shared checkpoint could run code through its metadata even when
    its pickle cannot. So the target must be ``build_network`` (what ``train.py``
    stores) or a module class of ``torch.nn`` itself, and the arguments plain values.
    """
    target = model_cfg.get("_target_")
    arguments = {k: v for k, v in model_cfg.items() if k != "_target_"}
    builder: Any = None
    if target == BUILD_NETWORK:
        builder = build_network
    elif isinstance(target, str) and target.startswith("torch.nn."):
        candidate = getattr(nn, target.removeprefix("torch.nn."), None)
        if isinstance(candidate, type) and issubclass(candidate, nn.Module):
            builder = candidate
    if builder is None:
        raise ConfigError(
            f"{key}={str(path)!r}: its network config names _target_={target!r}; expected "
            f"{BUILD_NETWORK} (or a torch.nn module class), as train.py writes"
        )
    try:
        return builder(**arguments)
    except (TypeError, ValueError) as error:  # arguments the builder does not take
        raise ConfigError(
            f"{key}={str(path)!r}: its network config does not fit: {error}"
        ) from None


def trained_network(
    model_cfg: dict[str, Any], weights: Mapping[str, torch.Tensor], path: Path, key: str
) -> nn.Module:
    """The network ``model_cfg`` describes (``network_from_record``) with ``weights`` loaded.

    ``path`` and ``key`` name the checkpoint in the refusals.
    """
    network = network_from_record(model_cfg, path, key)
    load_network_weights(network, weights, path, key)
    return network


def network_weights(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """The network's weights in a checkpoint's ``state_dict``, without their prefix."""
    return {k[len(PREFIX) :]: v for k, v in state_dict.items() if k.startswith(PREFIX)}


def load_network_weights(
    network: nn.Module, state: Mapping[str, torch.Tensor], path: Path, key: str
) -> None:
    """Load ``state`` into ``network`` if it covers it exactly, else refuse with the keys."""
    mismatch = compare_state(network.state_dict(), state)
    if mismatch:
        raise ConfigError(
            f"{key}={str(path)!r} does not fit the network ({type(network).__name__}): "
            f"{mismatch.describe()}"
        )
    network.load_state_dict(state)
