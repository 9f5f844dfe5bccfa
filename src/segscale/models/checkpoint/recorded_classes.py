"""The classes of an evaluation: the checkpoint's, unless the config gives the same ones.

``evaluate.py`` reads labelled images with the classes the checkpoint was trained on:
their names and number, colours, ignore index and the mask values that mean them
(``label_ids``, ``ignore_ids``). ``conf/evaluate.yaml`` therefore composes its
datamodule without a classes file, and its class keys hold ``FROM_CHECKPOINT``
(``checkpoint``), a value none of them can really take. That is how a value the user
gave (a classes file, ``datamodule/classes=binary``, or a key on the command line,
``datamodule.label_ids=[0, 255]``) is told from one left to the checkpoint: ``null``
could not serve, as it is a real value of ``label_ids`` (class indices) and
``class_colors`` (a default palette). A given value that means the same as the
checkpoint's is accepted; one that does not is refused, naming both.

Except ``ignore_ids``: the values given add to the checkpoint's. Masks of other data (or
of a test split) may hold a value that no class of the checkpoint has; ignoring it in
the evaluated masks leaves what the classes mean as it is, and only leaves those pixels
out of the scores. A value that is a class's is refused.

Normalization (``mean``, ``std``, the pixels' full intensity) needs no such care: the
network rebuilt from the checkpoint applies its own, and the datamodule's are not used.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from omegaconf import DictConfig, open_dict

from segscale.config_schema import plain
from segscale.data.classes.class_discovery import is_inferred
from segscale.data.classes.labels import LabelId, LabelMap, code_of, label_values, shown_value
from segscale.errors import ConfigError
from segscale.models.checkpoint.trained import TrainedModel

log = logging.getLogger(__name__)

FROM_CHECKPOINT = "checkpoint"
"""A class key's value in ``conf/evaluate.yaml``: take it from the checkpoint."""

CLASS_KEYS = (
    "class_names",
    "num_classes",
    "class_colors",
    "ignore_index",
    "label_ids",
    "ignore_ids",
)
"""The keys of ``datamodule`` that the checkpoint's classes fill in."""


def use_checkpoint_classes(datamodule: DictConfig, trained: TrainedModel, ckpt: str) -> None:
    """Set the class keys of ``datamodule`` (in place) to those of the ``trained`` model.

    Raises ``ConfigError`` for a key given a value that differs from the checkpoint's,
    naming the key, both values and ``ckpt``. ``datamodule.ignore_ids`` given add to the
    checkpoint's (``_add_ignore_ids``).
    """
    given = _given(datamodule)
    stored = _stored(trained)
    _add_ignore_ids(given, stored, ckpt)
    for key, value in given.items():
        if key in stored and not _same(key, value, stored):
            raise ConfigError(
                f"datamodule.{key}={value!r} differs from the {key} the checkpoint "
                f"ckpt={ckpt!r} was trained with: {stored[key]!r}; evaluate.py takes the "
                f"classes from the checkpoint: leave out datamodule/classes and "
                f"datamodule.{key} (or give the checkpoint's)"
            )
    values = {**given, **stored}
    with open_dict(datamodule):
        for key in CLASS_KEYS:
            datamodule[key] = values[key]


def _given(datamodule: DictConfig) -> dict[str, Any]:
    """The class keys the config gives a value of its own, as plain resolved values."""
    # datamodule/classes=auto: the classes the training masks held, which for evaluation
    # are the checkpoint's (training stored what it found). Values to ignore still add.
    if is_inferred(datamodule.get("label_ids")):
        log.info("datamodule/classes=auto: the classes are those the checkpoint found")
        ignore_ids = datamodule.get("ignore_ids", FROM_CHECKPOINT)
        if _is(ignore_ids, FROM_CHECKPOINT):
            return {}
        return {"ignore_ids": plain(ignore_ids)}
    given: dict[str, Any] = {}
    for key in CLASS_KEYS:
        value = datamodule.get(key, FROM_CHECKPOINT)
        if not _is(value, FROM_CHECKPOINT):
            given[key] = plain(value)  # resolved: potsdam_rgb's label_ids is ${.class_colors}
    names = given.get("class_names")
    if isinstance(names, list):  # names as training stored them: [1, 2] are "1", "2"
        given["class_names"] = [str(name) for name in names]
    return given


def _add_ignore_ids(given: dict[str, Any], stored: dict[str, Any], ckpt: str) -> None:
    """Move ``ignore_ids`` from ``given`` into ``stored``'s, after the checkpoint's own.

    Raises ``ConfigError`` naming the key for a value that is not a list of mask values,
    or that one of the checkpoint's classes has.
    """
    if "ignore_ids" not in given:
        return
    value = given.pop("ignore_ids")
    key = f"datamodule.ignore_ids={value!r}"
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of mask values, e.g. [7] or [[0, 0, 0]]")
    trained = LabelMap(
        stored["num_classes"], stored["ignore_index"], stored["label_ids"], stored["ignore_ids"]
    )
    expected = "expected mask values that none of its classes has (evaluate.py ignores them "
    expected += "besides the checkpoint's own)"
    values = label_values(value)  # ConfigError for an entry that is no mask value
    for v in values:
        index = _class_of(trained, v)
        if index is not None:
            raise ConfigError(
                f"{key}: mask value {shown_value(v)} is class {stored['class_names'][index]!r} "
                f"of ckpt={ckpt!r}; {expected}"
            )
    merged = [*stored["ignore_ids"], *value]
    try:  # decoded with the checkpoint's classes: grey levels and colours not mixed
        LabelMap(trained.num_classes, trained.ignore_index, stored["label_ids"], merged)
    except (ConfigError, TypeError, ValueError) as error:
        raise ConfigError(f"{key}: {error}; {expected}") from None
    added = [v for v in values if not trained.known(np.array([code_of(v)]))[0]]
    if added:
        shown = ", ".join(shown_value(v) for v in added)
        log.info("datamodule.ignore_ids: mask values [%s] ignored besides the checkpoint's", shown)
    plain = [list(v) if isinstance(v, tuple) else v for v in added]
    stored["ignore_ids"] = [*stored["ignore_ids"], *plain]


def _class_of(labels: LabelMap, value: LabelId) -> int | None:
    """The class that ``labels`` decode the mask value ``value`` to; ``None`` for none."""
    if not labels.known(np.array([code_of(value)]))[0]:
        return None
    index = int(labels.decode_codes(np.array([code_of(value)]))[0])
    return index if index < labels.num_classes else None


def _is(value: Any, marker: str) -> bool:
    """Whether a config value is the string ``marker`` (a list or a number never is)."""
    return isinstance(value, str) and value == marker


def _stored(trained: TrainedModel) -> dict[str, Any]:
    """The class keys as the checkpoint holds them."""
    record = trained.record
    return {
        "num_classes": trained.num_classes,
        "class_names": list(record.class_names),
        "class_colors": record.class_colors,
        "ignore_index": record.ignore_index,
        "label_ids": record.mask_labels.label_ids,
        "ignore_ids": record.mask_labels.ignore_ids,
    }


def _same(key: str, value: Any, stored: dict[str, Any]) -> bool:
    """Whether ``value`` of ``key`` means what the checkpoint's does.

    Label IDs are compared by the decoding they give (``LabelMap``), so that one class
    index per class equals ``null``, and ``[255]`` as ignore IDs equals ``[]`` when 255
    is the ignore index of grey masks anyway; every other key by value.
    """
    if value == stored[key]:
        return True
    if key not in ("label_ids", "ignore_ids"):
        return False
    label_ids = value if key == "label_ids" else stored["label_ids"]
    ignore_ids = value if key == "ignore_ids" else stored["ignore_ids"]
    try:
        decoding = LabelMap(stored["num_classes"], stored["ignore_index"], label_ids, ignore_ids)
    except (ConfigError, TypeError, ValueError):  # a value that cannot be the checkpoint's
        return False
    trained = LabelMap(
        stored["num_classes"], stored["ignore_index"], stored["label_ids"], stored["ignore_ids"]
    )
    return decoding.table == trained.table
