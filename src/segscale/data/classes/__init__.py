"""Mask values and classes: label maps, palettes, the classes found in the masks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from segscale.data import exported_names

if TYPE_CHECKING:
    from segscale.data.classes.class_discovery import ClassRow, InferredClasses, infer_classes
    from segscale.data.classes.labels import LabelMap
    from segscale.data.classes.mask_values import MaskValueCensus
    from segscale.data.classes.palette import distinct_colours

_WHERE = {
    "ClassRow": "class_discovery",
    "InferredClasses": "class_discovery",
    "LabelMap": "labels",
    "MaskValueCensus": "mask_values",
    "distinct_colours": "palette",
    "infer_classes": "class_discovery",
}
"""Each public name and the module that defines it, imported when the name is first used."""

__all__ = [
    "ClassRow",
    "InferredClasses",
    "LabelMap",
    "MaskValueCensus",
    "distinct_colours",
    "infer_classes",
]
__getattr__, __dir__ = exported_names(__name__, _WHERE)
