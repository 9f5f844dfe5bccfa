"""A checkpoint's record: what it carries besides its weights, written, parsed and checked.

``train.py`` stores the record under the checkpoint's ``segscale`` entry (``run_record``):
the resolved ``model`` config, the classes and the mask values that mean them,
normalization, the data it was trained on and how validation predicted whole images, as
plain values that weights-only loading accepts, so a checkpoint can be applied, and
evaluated on labelled images, without its training config. The record's layout is
numbered (``checkpoint_format``: ``CHECKPOINT_FORMAT``); ``parse_record`` turns a stored
entry into one typed ``CheckpointRecord``, refusing one of another format (or none),
one whose entries are of another type (the schema: ``METADATA``), or one making no sense.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from segscale.data.checks.value_range import ValueRange
from segscale.data.classes.labels import LabelMap
from segscale.data.sampling.patches import grid_inference
from segscale.errors import ConfigError
from segscale.version import __version__

if TYPE_CHECKING:
    from segscale.data.datamodule import SegmentationDataModule

ENTRY = "segscale"
"""The checkpoint entry that holds the record."""
CHECKPOINT_FORMAT = 1
"""The layout of the record ``run_record`` writes (its ``checkpoint_format``); a record of
another layout is refused (``check_format``). Raised when an entry changes its meaning or
type, or a new one is required."""


@dataclass(frozen=True)
class MaskLabels:
    """What the training masks held: ``datamodule.label_ids`` and ``ignore_ids`` as used.

    ``label_ids`` is ``None`` for class indices, else one entry per class (a grey level,
    an RGB triplet as a list, or a list of several); plain values, as a config has them.
    """

    label_ids: list[Any] | None
    ignore_ids: list[Any]


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint's ``segscale`` entry, checked, as typed values (``parse_record``)."""

    model: dict[str, Any]
    """The network config train.py built the network from (``encoder_weights`` null)."""
    class_names: tuple[str, ...]
    class_colors: list[list[int]] | None
    """The colours as the training config gave them (``None``: it gave none)."""
    ignore_index: int
    mean: list[float]
    std: list[float]
    max_value: float
    mask_labels: MaskLabels
    """The training masks' label IDs."""
    data_source: dict[str, Any]
    """The training run's ``datamodule.source`` (resolved, ``root`` absolute)."""
    validation_inference: dict[str, Any]
    """How validation predicted whole images (``grid_inference``)."""
    value_range: ValueRange | None
    """The training images' raw values per channel, which inputs must not be far outside
    (``None``: the data gave none)."""
    stored: dict[str, Any]
    """The entry as the file holds it (what a loaded module carries on to its own saves)."""

    @property
    def in_channels(self) -> int:
        """The network's input channels (``model.in_channels``; 3 where it is not given)."""
        return int(self.model.get("in_channels", 3))


def run_record(
    model_cfg: dict[str, Any], datamodule: SegmentationDataModule, source: DictConfig
) -> dict[str, Any]:
    """The ``segscale`` entry ``train.py`` writes: network config, classes, normalization.

    And the training images' value range (``value_range``: ``[low, high]`` raw values per
    channel, see ``segscale.data.checks.value_range``; null when the data gave none), and the
    data it was trained on (``data_source``, ``source`` as ``data_source_record`` stores it).

    With the classes go the mask values that mean them (``label_ids``, ``ignore_ids``,
    as ``mask_label_ids`` gives them), so that ``evaluate.py`` reads labelled images as
    training did without being told the classes again.
    """
    label_ids, ignore_ids = mask_label_ids(datamodule.labels)
    value_range = datamodule.value_range
    # Plain Python values only (no numpy scalars): weights-only loading refuses others.
    return {
        "checkpoint_format": CHECKPOINT_FORMAT,
        "segscale_version": __version__,  # for people and messages: the format is what is read
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
        "value_range": value_range.record() if value_range is not None else None,
        # What the network was trained on: evaluate.py's data by default.
        "data_source": data_source_record(source),
    }


def data_source_record(source: DictConfig) -> dict[str, Any]:
    """``datamodule.source`` as a checkpoint stores it: resolved plain values, ``root`` absolute.

    An absolute ``root`` finds the data from any working directory, as evaluating does.
    """
    plain = OmegaConf.to_container(source, resolve=True)
    assert isinstance(plain, dict)  # a config node of keys
    if isinstance(plain.get("root"), str):
        plain["root"] = str(Path(plain["root"]).absolute())
    return {str(key): value for key, value in plain.items()}


METADATA: dict[str, type | tuple[type, ...]] = {
    "model": dict,
    "class_names": list,
    "class_colors": (list, type(None)),
    "ignore_index": int,
    "mean": list,
    "std": list,
    "max_value": (int, float),
    "label_ids": (list, type(None)),
    "ignore_ids": list,
    "data_source": dict,  # the training datamodule.source (data_source_record)
    "segscale_version": str,
    "validation_inference": dict,
    "value_range": (list, type(None)),  # null where the data gave no range
}
"""What ``run_record`` writes, by type: a checkpoint's entry is checked against it."""


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


def parse_record(meta: Any, path: Path, key: str) -> CheckpointRecord:
    """The checked, typed record of a checkpoint's ``segscale`` entry ``meta``.

    ``path`` and ``key`` (the config key that gave it) name the file in the refusal of an
    entry that is not what ``train.py`` writes (``check_metadata``).
    """
    check_metadata(meta, path, key)
    record = meta["value_range"]
    return CheckpointRecord(
        model=meta["model"],
        class_names=tuple(str(name) for name in meta["class_names"]),
        class_colors=meta["class_colors"],
        ignore_index=meta["ignore_index"],
        mean=meta["mean"],
        std=meta["std"],
        max_value=float(meta["max_value"]),
        mask_labels=MaskLabels(meta["label_ids"], meta["ignore_ids"]),
        data_source=meta["data_source"],
        validation_inference=meta["validation_inference"],
        value_range=ValueRange.from_record(record) if record is not None else None,
        stored=meta,
    )


def check_metadata(meta: Any, path: Path, key: str) -> None:
    """Refuse a checkpoint whose ``segscale`` entry is not what ``train.py`` writes.

    Its format must be this segscale's (``check_format``), its entries of their types,
    then sound (``metadata_problems``).
    """
    if isinstance(meta, dict):
        check_format(meta, path, key)
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
    problems = metadata_problems(meta)
    if problems:
        raise ConfigError(
            f"{key}={str(path)!r}: its metadata makes no sense: {'; '.join(problems)}; "
            "expected a .ckpt written by train.py, unedited"
        )


def check_format(meta: dict[str, Any], path: Path, key: str) -> None:
    """Refuse a record of another format than ``CHECKPOINT_FORMAT``, or of none.

    The message names the file, both formats and the segscale that wrote it (if known).
    """
    found = meta.get("checkpoint_format")
    if isinstance(found, int) and not isinstance(found, bool) and found == CHECKPOINT_FORMAT:
        return
    writer = meta.get("segscale_version")
    by = f" (written by segscale {writer})" if isinstance(writer, str) else ""
    shown = "no checkpoint_format" if found is None else f"checkpoint_format={found!r}"
    raise ConfigError(
        f"{key}={str(path)!r} has {shown}{by}; this segscale {__version__} reads "
        f"checkpoint_format={CHECKPOINT_FORMAT} only: use the segscale that wrote it, or "
        "a checkpoint written by this one"
    )


def metadata_problems(meta: dict[str, Any]) -> list[str]:
    """What makes no sense in a type-checked ``segscale`` entry, each naming its key.

    Normalization must be finite, with a positive spread, one value per input channel;
    there must be as many class names (distinct) and colours as the network has classes;
    the ignore index must be a mask value (0 to 255) that no class has; label IDs must
    decode as training did (``LabelMap``); the validation patch side must be a size.
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
    problems += _range_problems(meta["value_range"], channels)
    problems += _validation_problems(meta["validation_inference"])
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


def _validation_problems(recorded: dict[str, Any]) -> list[str]:
    """The validation patch side: a positive number of pixels, as written."""
    side = recorded.get("tile_size")
    if isinstance(side, bool) or not isinstance(side, int) or side < 1:
        return [
            f"validation_inference.tile_size={side!r}: expected the validation patch side, "
            "a positive number of pixels"
        ]
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
    else:
        try:
            LabelMap(num_classes, ignore, meta["label_ids"], meta["ignore_ids"])
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
