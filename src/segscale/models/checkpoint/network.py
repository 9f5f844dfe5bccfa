"""The network a checkpoint holds: built from its record, its weights loaded exactly.

The record's ``model`` config is built without Hydra (``network_from_record``), and the
checkpoint's weights must then fit the network key for key and shape for shape
(``load_network_weights``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
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
BUILDERS: Mapping[str, Callable[..., nn.Module]] = MappingProxyType({BUILD_NETWORK: build_network})
"""The network builders a checkpoint may name, by their ``_target_``: those ``train.py`` writes."""
FIELD = "segscale.model._target_"
"""Where a checkpoint names its network's builder, for the refusals."""


def network_from_record(model_cfg: dict[str, Any], path: Path, key: str) -> nn.Module:
    """The network a checkpoint's ``model`` config describes, built without Hydra.

    Hydra's ``instantiate`` would call whatever ``_target_`` names, reached through any
    module's attributes (``segscale.models.weights.torch.load``, say), and resolve
    interpolations: a shared checkpoint could run code through its metadata even when
    its pickle cannot. And a module of torch that is no segmentation network
    (``torch.nn.Identity``) would build, load its few weights and fail only when it
    predicts, naming nothing. So the target must be one of ``BUILDERS`` (what
    ``train.py`` stores, looked up by name, never imported), and the arguments plain values.
    """
    target = model_cfg.get("_target_")
    arguments = {k: v for k, v in model_cfg.items() if k != "_target_"}
    builder = BUILDERS.get(target) if isinstance(target, str) else None
    if builder is None:
        raise ConfigError(
            f"{key}={str(path)!r}: its {FIELD}={target!r} is not a network segscale builds; "
            f"expected {' or '.join(BUILDERS)}, as train.py writes (a checkpoint of "
            "another network, or one edited)"
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
