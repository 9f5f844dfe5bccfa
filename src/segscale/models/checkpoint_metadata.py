"""What a checkpoint carries for inference, and the network rebuilt from it.

``train.py`` stores ``inference_metadata`` in every checkpoint (the resolved ``model``
config, classes, normalization) as plain values that weights-only loading accepts, so
a checkpoint can be applied without its training config. The file is read weights-only
and verified against its digest (``checkpoint_io``), and its weights must fit the
rebuilt network exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from segscale.errors import ConfigError
from segscale.models.checkpoint_io import load_checkpoint_file
from segscale.models.networks import build_network
from segscale.models.weights import load_network_weights

if TYPE_CHECKING:
    from segscale.data.datamodule import SegmentationDataModule


def inference_metadata(
    model_cfg: dict[str, Any], datamodule: SegmentationDataModule
) -> dict[str, Any]:
    """What a checkpoint must carry for inference: network config, classes, normalization."""
    # Plain Python values only (no numpy scalars): weights-only loading refuses others.
    return {
        "model": {**model_cfg, "encoder_weights": None},  # the checkpoint holds the weights
        "class_names": [str(name) for name in datamodule.class_names],
        "class_colors": [[int(v) for v in c] for c in datamodule.class_colors or []] or None,
        "ignore_index": int(datamodule.ignore_index),
        "mean": [float(v) for v in datamodule.mean],
        "std": [float(v) for v in datamodule.std],
        "max_value": float(datamodule.max_value),
    }


METADATA: dict[str, type | tuple[type, ...]] = {
    "model": dict,
    "class_names": list,
    "class_colors": (list, type(None)),
    "ignore_index": int,
    "mean": list,
    "std": list,
    "max_value": (int, float),
}
"""What ``inference_metadata`` holds, by type: a checkpoint's is checked against it."""

BUILD_NETWORK = f"{build_network.__module__}.{build_network.__qualname__}"
"""The ``_target_`` of the network config that ``train.py`` stores."""


def network_from_metadata(model_cfg: dict[str, Any], path: Path, key: str) -> nn.Module:
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


def check_metadata(meta: Any, path: Path, key: str) -> None:
    """Refuse a checkpoint whose ``segscale`` entry is not what ``train.py`` writes."""
    wrong = (
        [name for name, kind in METADATA.items() if not isinstance(meta.get(name), kind)]
        if isinstance(meta, dict)
        else list(METADATA)
    )
    if wrong:
        raise ConfigError(
            f"{key}={str(path)!r} is not a segscale checkpoint: its 'segscale' entry lacks "
            f"{wrong} (or they are of another type); expected a .ckpt written by train.py"
        )


def read_trained_network(path: str | Path, key: str = "ckpt") -> tuple[nn.Module, dict[str, Any]]:
    """The network of a ``train.py`` checkpoint with its weights, and its metadata.

    ``key`` names the config key that gave ``path``, for error messages.
    """
    path = Path(path)
    checkpoint = load_checkpoint_file(path, key)
    meta = checkpoint.get("segscale")
    check_metadata(meta, path, key)
    assert isinstance(meta, dict)  # check_metadata refuses anything else
    if not isinstance(checkpoint.get("state_dict"), dict):
        raise ConfigError(f"{key}={str(path)!r} has no state_dict; expected a .ckpt from train.py")
    network = network_from_metadata(meta["model"], path, key)
    prefix = "network."
    weights = {
        k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)
    }
    load_network_weights(network, weights, path, key)
    return network, meta
