"""Classes found in the training masks (``datamodule/classes=auto``), and the per-class table.

Each distinct value of the training masks (a grey level in single-channel masks, an RGB
colour in colour masks; a palette mask's colours or indices, as ``colour_masks`` in
``segscale.data.checks.mask_value_scan`` decides) becomes a class, in ascending order of value,
except the values the user marks as void (``datamodule.ignore_ids``) and, in grey
masks, the ignore index itself. The result is a classes file like those under
``conf/datamodule/classes/``, written into the run folder ready to copy
(``InferredClasses.yaml``).

The classes of a dataset as its masks hold them: per class, its values, pixels and files.

``class_rows`` counts them from a census of the masks' values under the label settings;
``class_table`` prints them (class, mask value, pixels, share, files), as the data
command and ``datamodule/classes=auto`` show them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from segscale.data.classes.labels import (
    LabelId,
    LabelMap,
    class_colours,
    code_of,
    label_values,
    shown_value,
)
from segscale.data.classes.mask_values import MaskValueCensus, masks_kind, palette_note
from segscale.errors import ConfigError

AUTO = "auto"
"""The value of ``datamodule.label_ids`` (and ``num_classes``) that asks for inference."""
OPTION = "datamodule/classes=auto"
"""How errors name the feature."""
CLASSES_FILE = "classes.yaml"
"""The inferred classes file in the run folder."""


def is_inferred(label_ids: Any) -> bool:
    """Whether ``datamodule.label_ids`` asks for the classes of the training masks."""
    return isinstance(label_ids, str) and label_ids == AUTO


@dataclass(frozen=True)
class InferredClasses:
    """The classes found in the training masks, as a classes file sets them."""

    label_ids: tuple[LabelId, ...]
    """Per class, its mask value (ascending)."""
    class_names: tuple[str, ...]
    class_colors: tuple[tuple[int, int, int], ...]
    ignore_index: int
    ignore_ids: tuple[LabelId, ...]
    pixels: tuple[int, ...]
    """Training pixels of each class."""
    files: tuple[int, ...]
    """Training masks that hold each class."""
    colour: bool
    """Colour masks (else grey levels)."""
    palette_masks: int = 0
    """Training masks that are palette masks (read by colour for ``colour``, else by index)."""

    @property
    def kind(self) -> str:
        """The masks' kind in words (``RGB colours``), with their palette masks."""
        return masks_kind(self.colour, self.palette_masks)

    @property
    def num_classes(self) -> int:
        """How many classes were found."""
        return len(self.label_ids)

    def settings(self) -> dict[str, Any]:
        """The ``datamodule`` keys of these classes, as plain values (lists, not tuples)."""
        return {
            "num_classes": self.num_classes,
            "class_names": list(self.class_names),
            "class_colors": [list(c) for c in self.class_colors],
            "ignore_index": self.ignore_index,
            "label_ids": [_plain(v) for v in self.label_ids],
            "ignore_ids": [_plain(v) for v in self.ignore_ids],
        }

    def table(self) -> str:
        """The classes as a printable table: name, mask value, pixels, share, files."""
        return class_table(
            [
                ClassRow(name, (value,), pixels, files)
                for name, value, pixels, files in zip(
                    self.class_names, self.label_ids, self.pixels, self.files, strict=True
                )
            ]
        )

    def yaml(self, where: str) -> str:
        """The classes file: ``# @package datamodule``, the keys, and how to use a copy.

        ``where`` says whose training masks they came from (for the header comment).
        """
        lines = [
            "# @package datamodule",
            f"# The classes {OPTION} found in the training masks of {where} ({self.kind}).",
            "# To train with them as they are (or with names of your own), copy this file to",
            "#   <your config dir>/datamodule/classes/<name>.yaml",
            "# and train with",
            "#   python train.py --config-dir <your config dir> datamodule/classes=<name> ...",
            "# or with hydra.searchpath=[file://<your config dir>] instead of --config-dir.",
            "#",
            "# class: mask value, training pixels, training masks",
        ]
        lines += [
            f"#   {name}: {shown_value(value)}, {pixels:,} px, {files} file(s)"
            for name, value, pixels, files in zip(
                self.class_names, self.label_ids, self.pixels, self.files, strict=True
            )
        ]
        lines += [f"{key}: {json.dumps(value)}" for key, value in self.settings().items()]
        return "\n".join(lines) + "\n"


def infer_classes(
    census: MaskValueCensus,
    ignore_index: int = 255,
    ignore_ids: Sequence[Any] = (),
    class_names: Sequence[str] | None = None,
    class_colors: Sequence[Sequence[int]] | None = None,
    num_classes: int | str = AUTO,
) -> InferredClasses:
    """The classes of the training masks' values in ``census`` (see the module docstring).

    ``class_names``, ``class_colors`` and an integer ``num_classes``, when given, must
    fit the number of classes found; ``ignore_ids`` must be of the masks' kind. Each
    mismatch is a ``ConfigError`` that names the key and the classes found.
    """
    void = _void_codes(census, ignore_ids)
    if not census.colour:
        void.add(ignore_index)
    codes = [c for c in census.codes if c not in void]
    values = [census.value(c) for c in codes]
    _check_count(census, values, ignore_index, num_classes)
    names = _names(values, class_names)
    colours = _colours(values, class_colors, census.colour)
    return InferredClasses(
        label_ids=tuple(values),
        class_names=names,
        class_colors=colours,
        ignore_index=ignore_index,
        ignore_ids=tuple(label_values(ignore_ids)),
        pixels=tuple(census.pixels[c] for c in codes),
        files=tuple(len(census.files[c]) for c in codes),
        colour=census.colour,
        palette_masks=len(census.palette_files),
    )


def _void_codes(census: MaskValueCensus, ignore_ids: Sequence[Any]) -> set[int]:
    """The codes of ``ignore_ids``, which must be RGB triplets for colour masks, else grey."""
    values = label_values(ignore_ids)
    wrong = [v for v in values if isinstance(v, tuple) != census.colour]
    if wrong:
        kind, expected = ("RGB colour", "RGB triplets") if census.colour else ("grey", "levels")
        raise ConfigError(
            f"datamodule.ignore_ids={[_plain(v) for v in values]}: the training masks are "
            f"{kind} masks{palette_note(census.colour, len(census.palette_files))}, so {OPTION} "
            f"expects {expected} there"
        )
    return {code_of(v) for v in values}


def _check_count(
    census: MaskValueCensus, values: list[LabelId], ignore_index: int, num_classes: int | str
) -> None:
    """Refuse fewer than 2 classes, more than class indices hold, or another ``num_classes``."""
    found = ", ".join(shown_value(v) for v in values[:12]) + (", ..." if len(values) > 12 else "")
    if len(values) < 2:
        raise ConfigError(
            f"{OPTION}: the training masks hold {len(values)} value(s) that are not ignored "
            f"({found or 'none'}); a segmentation needs at least 2 classes"
        )
    if ignore_index < len(values):
        raise ConfigError(
            f"datamodule.ignore_index={ignore_index} is the index of one of the {len(values)} "
            f"classes {OPTION} found ({found}); expected an index >= {len(values)} (255). "
            "A mask value that means 'ignore' goes in datamodule.ignore_ids"
        )
    if len(values) > 255:
        raise ConfigError(
            f"{OPTION}: the training masks hold {len(values)} distinct values, more than the "
            "255 classes a mask can name; are the masks images?"
        )
    if num_classes != AUTO and num_classes != len(values):
        raise ConfigError(
            f"datamodule.num_classes={num_classes}, but {OPTION} found {len(values)} classes "
            f"in the training masks ({found}); expected auto (or {len(values)})"
        )


def _names(values: list[LabelId], class_names: Sequence[str] | None) -> tuple[str, ...]:
    """``class_names``, or ``class_<value>`` (``class_<r>_<g>_<b>``) per value."""
    if class_names is None:
        return tuple(
            "class_" + "_".join(str(x) for x in v) if isinstance(v, tuple) else f"class_{v}"
            for v in values
        )
    if len(class_names) != len(values):
        found = ", ".join(shown_value(v) for v in values)
        raise ConfigError(
            f"datamodule.class_names has {len(class_names)} names {list(class_names)}, but "
            f"{OPTION} found {len(values)} classes in the training masks (values {found}); "
            "expected one name per class, in that order"
        )
    return tuple(str(n) for n in class_names)


def _colours(
    values: list[LabelId], class_colors: Sequence[Sequence[int]] | None, colour: bool
) -> tuple[tuple[int, int, int], ...]:
    """``class_colors``, else each colour mask's own colour, else a fixed palette."""
    if class_colors is not None:
        if len(class_colors) != len(values):
            raise ConfigError(
                f"datamodule.class_colors has {len(class_colors)} colours, but {OPTION} found "
                f"{len(values)} classes in the training masks; expected one RGB triplet per "
                "class, or null"
            )
        palette = [tuple(int(x) for x in c) for c in class_colors]
    elif colour:
        palette = [tuple(v) for v in values if isinstance(v, tuple)]
    else:
        palette = [tuple(c) for c in class_colours(None, len(values)).tolist()]
    return tuple((c[0], c[1], c[2]) for c in palette)


def _plain(value: LabelId) -> int | list[int]:
    """A mask value as YAML holds it: an int, or a list for a colour."""
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class ClassRow:
    """One class of a table: its name, mask values, pixels and the masks that hold it."""

    name: str
    values: tuple[LabelId, ...]
    pixels: int
    files: int


def class_rows(
    census: MaskValueCensus, labels: LabelMap, class_names: Sequence[str]
) -> list[ClassRow]:
    """Per class of ``labels``: the values that mean it, and its pixels and files in ``census``."""
    values: dict[int, list[LabelId]] = {c: [] for c in range(labels.num_classes)}
    for value, index in labels.table.items():
        if index < labels.num_classes:
            values[index].append(value)
    codes = census.codes
    classes = labels.decode_codes(np.asarray(codes, np.int64)).tolist()
    pixels = dict.fromkeys(values, 0)
    files: dict[int, set[str]] = {c: set() for c in values}
    for code, index in zip(codes, classes, strict=True):
        if index in pixels:
            pixels[index] += census.pixels[code]
            files[index].update(str(p) for p in census.files[code])
    return [
        ClassRow(str(name), tuple(sorted(values[c], key=_order)), pixels[c], len(files[c]))
        for c, name in enumerate(class_names)
    ]


def class_table(rows: Sequence[ClassRow]) -> str:
    """``rows`` as a printable table: class, mask value, pixels, share (of their sum), files."""
    total = max(sum(row.pixels for row in rows), 1)
    shown = [", ".join(shown_value(v) for v in row.values) for row in rows]
    name_width = max(len("class"), *(len(row.name) for row in rows))
    value_width = max(len("value"), *(len(v) for v in shown))
    lines = [
        f"  {'class':<{name_width}}  {'value':<{value_width}}  {'pixels':>13}  {'share':>7}  files"
    ]
    for row, value in zip(rows, shown, strict=True):
        lines.append(
            f"  {row.name:<{name_width}}  {value:<{value_width}}  {row.pixels:>13,}  "
            f"{row.pixels / total:>7.2%}  {row.files}"
        )
    return "\n".join(lines)


def _order(value: LabelId) -> tuple[int, ...]:
    return value if isinstance(value, tuple) else (value,)
