"""What a checkpoint carries for inference, and the network rebuilt from it.

``train.py`` stores ``inference_metadata`` in every checkpoint (the resolved ``model``
config, classes, what the mask files hold, normalization) as plain values that
weights-only loading accepts, so a checkpoint can be applied, and evaluated on
labelled images, without its training config. The file is read weights-only and
verified against its digest (``checkpoint_io``), and its weights must fit the rebuilt
network exactly.
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
    from segscale.data.labels import LabelMap


def inference_metadata(
    model_cfg: dict[str, Any], datamodule: SegmentationDataModule
) -> dict[str, Any]:
    """What a checkpoint must carry for inference: network config, classes, normalization.

    With the classes go the mask values that mean them (``label_ids``, ``ignore_ids``,
    as ``mask_label_ids`` gives them), so that ``evaluate.py`` reads labelled images as
    training did without being told the classes again.
    """
    label_ids, ignore_ids = mask_label_ids(datamodule.labels)
    # Plain Python values only (no numpy scalars): weights-only loading refuses others.
    return {
        "model": {**model_cfg, "encoder_weights": None},  # the checkpoint holds the weights
        "class_names": [str(name) for name in datamodule.class_names],
        "class_colors": [[int(v) for v in c] for c in datamodule.class_colors or []] or None,
        "ignore_index": int(datamodule.ignore_index),
        "label_ids": label_ids,
        "ignore_ids": ignore_ids,
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

LATER_METADATA: dict[str, type | tuple[type, ...]] = {
    "label_ids": (list, type(None)),
    "ignore_ids": list,
    "data_source": dict,  # the training datamodule.source (added by training.builders)
}
"""Entries that checkpoints written before segscale stored them lack: checked if present.

Such a checkpoint still loads; its masks' encoding is unknown (``TrainedModel``)."""


def mask_label_ids(labels: LabelMap) -> tuple[list[Any] | None, list[Any]]:
    """``label_ids`` and ``ignore_ids`` as a classes file writes them, from a ``LabelMap``.

    ``label_ids`` is ``None`` when the masks hold class indices; else one entry per class:
    a grey level, an RGB triplet (a list), or a list of several. ``ignore_ids`` lists the
    further values that mean "ignore"; the ignore index itself, which a grey mask may
    always hold, is left out. Read back from the map's table, so that what is stored is
    what decoding used, whatever form the config gave it in (``${.class_colors}``, say).
    """
    per_class: list[list[Any]] = [[] for _ in range(labels.num_classes)]
    ignored: list[Any] = []
    for value, index in labels.table.items():
        plain = [int(v) for v in value] if isinstance(value, tuple) else int(value)
        if index == labels.ignore_index:
            if labels.colour or plain != labels.ignore_index:
                ignored.append(plain)
        else:
            per_class[index].append(plain)
    if not labels.colour and all(values == [k] for k, values in enumerate(per_class)):
        return None, ignored  # class indices
    return [values[0] if len(values) == 1 else values for values in per_class], ignored


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
        + [
            name
            for name, kind in LATER_METADATA.items()
            if name in meta and not isinstance(meta[name], kind)
        ]
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
