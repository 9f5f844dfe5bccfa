"""What a checkpoint carries for inference, and the network rebuilt from it.

``train.py`` stores ``inference_metadata`` in every checkpoint (the resolved ``model``
config, classes, what the mask files hold, normalization) as plain values that
weights-only loading accepts, so a checkpoint can be applied, and evaluated on
labelled images, without its training config. The file is read weights-only and
verified against its digest (``checkpoint_io``), and its weights must fit the rebuilt
network exactly.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version
from torch import nn

from segscale.data.labels import LabelMap
from segscale.data.patches import grid_inference
from segscale.data.value_range import ValueRange
from segscale.errors import ConfigError
from segscale.models.checkpoint_io import load_checkpoint_file
from segscale.models.networks import build_network
from segscale.models.weights import load_network_weights
from segscale.version import UNKNOWN_LOCAL, __version__

if TYPE_CHECKING:
    from segscale.data.datamodule import SegmentationDataModule
    from segscale.data.labels import LabelMap


def inference_metadata(
    model_cfg: dict[str, Any], datamodule: SegmentationDataModule
) -> dict[str, Any]:
    """What a checkpoint must carry for inference: network config, classes, normalization.

    And the training images' value range (``value_range``: ``[low, high]`` raw values per
    channel, see ``segscale.data.value_range``), when the data gave one.

    With the classes go the mask values that mean them (``label_ids``, ``ignore_ids``,
    as ``mask_label_ids`` gives them), so that ``evaluate.py`` reads labelled images as
    training did without being told the classes again.
    """
    label_ids, ignore_ids = mask_label_ids(datamodule.labels)
    value_range = datamodule.value_range
    # Plain Python values only (no numpy scalars): weights-only loading refuses others.
    return {
        "segscale_version": __version__,
        "model": {**model_cfg, "encoder_weights": None},  # the checkpoint holds the weights
        "class_names": [str(name) for name in datamodule.class_names],
        "class_colors": [[int(v) for v in c] for c in datamodule.class_colors or []] or None,
        "ignore_index": int(datamodule.ignore_index),
        "label_ids": label_ids,
        "ignore_ids": ignore_ids,
        "mean": [float(v) for v in datamodule.mean],
        "std": [float(v) for v in datamodule.std],
        "max_value": float(datamodule.max_value),
        # How validation predicted whole tiles: evaluate.py's default inference.
        "validation_inference": grid_inference(datamodule.patch_size),
        # The training images' values, raw: inputs far outside them are refused.
        **({"value_range": value_range.record()} if value_range is not None else {}),
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
    "segscale_version": str,
    "validation_inference": dict,
    "value_range": list,
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
    """Refuse a checkpoint whose ``segscale`` entry is not what ``train.py`` writes.

    Its entries are checked for type, then for meaning (``metadata_problems``), and the
    segscale that wrote it must not be newer than this one (``check_written_version``).
    """
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
    check_written_version(meta, path, key)
    problems = metadata_problems(meta)
    if problems:
        raise ConfigError(
            f"{key}={str(path)!r}: its metadata makes no sense: {'; '.join(problems)}; "
            "expected a .ckpt written by train.py, unedited"
        )


def check_written_version(meta: dict[str, Any], path: Path, key: str) -> None:
    """Refuse a checkpoint written by a newer segscale than this one.

    A newer one may store what this one would misread. A checkpoint without a version
    (written before segscale stored it) is older, and loads; a source tree never
    installed has no version of its own, and loads any.
    """
    written = meta.get("segscale_version")
    if written is None:
        return
    try:
        theirs = Version(str(written))
    except InvalidVersion:
        raise ConfigError(
            f"{key}={str(path)!r}: segscale_version={written!r} is not a version; expected "
            "a .ckpt written by train.py"
        ) from None
    ours = Version(__version__)
    if ours.local != UNKNOWN_LOCAL and theirs > ours:
        raise ConfigError(
            f"{key}={str(path)!r} was written by segscale {written}, newer than this "
            f"segscale {__version__}; upgrade segscale (pip install -U segscale) "
            "to read it"
        )


def metadata_problems(meta: dict[str, Any]) -> list[str]:
    """What makes no sense in a type-checked ``segscale`` entry, each naming its key.

    Normalization must be finite, with a positive spread, one value per input channel;
    there must be as many class names (distinct) and colours as the network has classes;
    the ignore index must be a mask value (0 to 255) that no class has; label IDs must
    decode as training did (``LabelMap``).
    """
    names = meta["class_names"]
    problems = _class_problems(names, meta["model"])
    channels = meta["model"].get("in_channels", 3)
    for name in ("mean", "std"):
        values = meta[name]
        if not all(_number(v) for v in values) or len(values) != channels:
            problems.append(f"{name}={values!r}: expected {channels} numbers, one a channel")
        elif not all(math.isfinite(v) for v in values):
            problems.append(f"{name}={values!r}: expected finite numbers")
        elif name == "std" and min(values) <= 0:
            problems.append(f"std={values!r}: expected positive numbers (it divides)")
    max_value = meta["max_value"]
    if not _number(max_value) or not math.isfinite(max_value) or max_value <= 0:
        problems.append(f"max_value={max_value!r}: expected a positive finite number")
    problems += _range_problems(meta.get("value_range"), channels)
    if problems:  # the checks below count on the classes (and the rest) being sound
        return problems
    return _label_problems(meta, len(names))


def _class_problems(names: list[Any], model: dict[str, Any]) -> list[str]:
    """Class names against the network's outputs."""
    classes = model.get("num_classes", model.get("out_channels"))
    if not names or not all(isinstance(n, str) for n in names) or len(set(names)) < len(names):
        return [f"class_names={names!r}: expected distinct names, at least one"]
    if classes is not None and (not isinstance(classes, int) or classes != len(names)):
        return [f"class_names: {len(names)} names for a network of {classes!r} classes"]
    if len(names) > 255:
        return [f"class_names: {len(names)} classes; expected at most 255"]
    return []


def _range_problems(record: Any, channels: int) -> list[str]:
    """The value range (if recorded) against the input channels."""
    if record is None:
        return []
    try:
        value_range = ValueRange.from_record(record)
    except ValueError as error:
        return [f"value_range={record!r}: {error}"]
    if value_range.channels != channels:
        return [f"value_range={record!r}: expected {channels} [low, high] pairs, one a channel"]
    return []


def _label_problems(meta: dict[str, Any], num_classes: int) -> list[str]:
    """Colours, ignore index and label IDs against the number of classes."""
    problems = []
    colours = meta["class_colors"]
    if colours is not None and (len(colours) != num_classes or not all(_rgb(c) for c in colours)):
        problems.append(
            f"class_colors={colours!r}: expected {num_classes} RGB triplets (0 to 255), one a class"
        )
    ignore = meta["ignore_index"]
    if isinstance(ignore, bool) or not num_classes <= ignore <= 255:
        problems.append(
            f"ignore_index={ignore!r}: expected a mask value that no class has "
            f"({num_classes} to 255)"
        )
    elif "label_ids" in meta or "ignore_ids" in meta:
        try:
            LabelMap(num_classes, ignore, meta.get("label_ids"), meta.get("ignore_ids") or [])
        except (ConfigError, TypeError, ValueError, OverflowError) as error:
            problems.append(f"label_ids/ignore_ids: {error}")
    return problems


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rgb(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in value)
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
