"""The classes of a dataset as its masks hold them: per class, its values, pixels and files.

``class_rows`` counts them from a census of the masks' values under the label settings;
``class_table`` prints them (class, mask value, pixels, share, files), as the data
command and ``datamodule/classes=auto`` show them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from segscale.data.classes.labels import LabelId, LabelMap, shown_value
from segscale.data.classes.mask_values import MaskValueCensus


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
