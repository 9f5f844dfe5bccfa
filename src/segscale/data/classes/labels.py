"""Mask values → class indices: MATLAB's label IDs, for class-index and colour masks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from segscale.data.classes.palette import GUARANTEED_CLASSES, distinct_colours
from segscale.errors import ConfigError

LabelId = int | tuple[int, int, int]
"""One mask value: a grey level or class index, or an RGB colour."""


class LabelMap:
    """How mask files encode classes, and the decoding into class indices.

    ``label_ids=None``: the masks hold class indices ``0 … num_classes-1`` (and
    ``ignore_index``) directly. Otherwise ``label_ids`` has one entry per class, as
    MATLAB's ``pixelLabelDatastore(..., classNames, labelIDs)``: a grey level (single-
    channel masks, e.g. ``[0, 128, 255]``) or an RGB triplet (colour masks, e.g. ISPRS
    Potsdam's ``[[255, 255, 255], [0, 0, 255], ...]``); an entry may also be a list of
    several values that all mean that class. ``ignore_ids`` are further mask values
    that become ``ignore_index`` (e.g. a "no data" colour). Any other value in a mask is
    unknown: validation reports it and decoding maps it to ``ignore_index``. Grey masks
    may also hold ``ignore_index`` itself, unless it is a class's label ID.
    """

    def __init__(
        self,
        num_classes: int,
        ignore_index: int = 255,
        label_ids: Sequence[Any] | None = None,
        ignore_ids: Sequence[Any] = (),
    ) -> None:
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.colour = False
        self.table: dict[LabelId, int] = {}
        self._plain = label_ids is None and not ignore_ids
        self._ignore_ids = bool(ignore_ids)
        self.ignore_ids: tuple[LabelId, ...] = tuple(
            _values_of_list(ignore_ids, "datamodule.ignore_ids")
        )
        """The mask values ``ignore_ids`` names, one by one."""
        if label_ids is None:
            self.table = {c: c for c in range(num_classes)}
            self.table[ignore_index] = ignore_index
        else:
            if len(label_ids) != num_classes:
                raise ConfigError(
                    f"datamodule.label_ids has {len(label_ids)} entries for {num_classes} "
                    "classes; expected one grey level or RGB triplet per class"
                )
            for index, entry in enumerate(label_ids):
                for value in _values_of(entry, "datamodule.label_ids"):
                    self._add(value, index, "datamodule.label_ids")
        for value in self.ignore_ids:
            self._add(value, ignore_index, "datamodule.ignore_ids")
        keys = list(self.table)
        self.colour = bool(keys) and isinstance(keys[0], tuple)
        if not self.colour:  # a grey mask may hold the ignore index itself
            self.table.setdefault(ignore_index, ignore_index)
        if any(isinstance(k, tuple) != self.colour for k in keys):
            raise ConfigError(
                "datamodule.label_ids and datamodule.ignore_ids mix grey levels and RGB "
                "triplets; expected all of one kind"
            )
        # The table as sorted packed codes and their classes, for decoding by search.
        codes = np.array([self._code(k) for k in self.table], np.int64)
        order = np.argsort(codes)
        self._sorted_codes = codes[order]
        self._sorted_classes = np.array(list(self.table.values()), np.uint8)[order]

    def _add(self, value: LabelId, index: int, key: str) -> None:
        if value in self.table and self.table[value] != index:
            raise ConfigError(f"{key}: mask value {value} is given for two classes")
        self.table[value] = index

    @property
    def is_plain(self) -> bool:
        """Whether masks hold class indices themselves (no label IDs, no ignore IDs)."""
        return self._plain

    def is_identity(self, raw: Any) -> bool:
        """Whether ``raw`` (uint8 class indices, no label IDs) needs no decoding."""
        return self._plain and raw.ndim == 2 and raw.dtype == np.uint8

    @property
    def channels(self) -> int:
        """Channels a mask file must have: 3 for colour masks, else 1."""
        return 3 if self.colour else 1

    def codes(self, raw: np.ndarray) -> np.ndarray:
        """One integer per pixel that identifies its mask value (RGB packed into 24 bits)."""
        if self.colour:
            return mask_codes(raw)
        return raw.astype(np.int64, copy=False)

    def _code(self, value: LabelId) -> int:
        # The table's keys are all RGB triplets or all grey levels (checked in __init__).
        return code_of(value)

    def value_of_code(self, code: int) -> LabelId:
        """The mask value (grey level or RGB triplet) that ``codes`` packed into ``code``."""
        return value_of_code(code, self.colour)

    def decode(self, raw: np.ndarray, palette_table: np.ndarray | None = None) -> np.ndarray:
        """Class indices (H×W uint8) of a decoded mask file; unknown values → ignore_index.

        ``palette_table``: a palette mask's (``palette_table``), whose indices ``raw`` holds.
        """
        if palette_table is not None:
            return palette_table[raw]
        return self.decode_codes(self.codes(raw))

    def palette_table(self, palette: np.ndarray | None) -> np.ndarray | None:
        """How a palette mask with ``palette`` (n×3 colours) is read: a class per index.

        Colour labels read a palette mask by its colours: index *i* means the class of
        the palette's *i*-th colour, whatever order the file gave its palette (files of
        one dataset may order theirs differently). The table (uint8, one entry per
        possible index, at least 256) is looked up once per pixel, where decoding the
        colours themselves would pack three channels and search the label table per
        pixel; an index beyond the palette, or of an unknown colour, is the ignore index
        (the validation pass reports both). Other labels (class indices, grey levels)
        read it by index, as any one-channel mask (Pascal VOC's indices are its class
        ids): ``None``, and so for a mask without a palette.
        """
        if palette is None or not self.colour:
            return None
        table = np.full(max(256, len(palette)), self.ignore_index, np.uint8)
        table[: len(palette)] = self.decode_codes(palette_codes(palette))
        return table

    def decode_codes(self, codes: np.ndarray) -> np.ndarray:
        """Class indices (uint8) of mask values packed by ``codes``; unknown → ignore_index."""
        keys, classes = self._sorted_codes, self._sorted_classes
        position = np.clip(np.searchsorted(keys, codes), 0, len(keys) - 1)
        return np.where(keys[position] == codes, classes[position], self.ignore_index).astype(
            np.uint8
        )

    def unknown(self, codes: np.ndarray) -> list[LabelId]:
        """The mask values among the unique ``codes`` that name no class and are not ignored."""
        codes = np.asarray(codes, np.int64)
        return [self.value_of_code(int(c)) for c in codes[~self.known(codes)]]

    def known(self, codes: np.ndarray) -> np.ndarray:
        """Per code (``codes``' packing): whether it names a class or is ignored (bool)."""
        return np.isin(np.asarray(codes, np.int64), self._sorted_codes)

    def describe(self) -> dict[str, Any]:
        """The settings that decoding depends on (for cache keys)."""
        return {
            "ignore_index": self.ignore_index,
            "table": sorted((str(k), v) for k, v in self.table.items()),
        }

    def describe_known(self) -> str:
        """The mask values that mean something, in words (for messages)."""
        if self.is_plain:
            classes = f"class indices 0-{self.num_classes - 1}"
        else:
            kind = "colours" if self.colour else "grey levels"
            classes = f"the {kind} of datamodule.label_ids"
        ignored = [] if self.colour else [f"the ignore index {self.ignore_index}"]
        if self._ignore_ids:
            ignored.append("datamodule.ignore_ids")
        return " or ".join([classes, *ignored])


def mask_codes(raw: np.ndarray) -> np.ndarray:
    """One integer per pixel for its mask value: the grey level, or RGB in 24 bits.

    ``raw`` is H×W (grey levels, class indices; int64 codes) or H×W×3 (colours; uint32
    codes, half the memory for a whole tile), as ``read_mask`` gives it.
    """
    if raw.ndim == 3:
        rgb = raw.astype(np.uint32)
        return (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
    return raw.astype(np.int64, copy=False)


def palette_codes(palette: np.ndarray) -> np.ndarray:
    """The code (``mask_codes``' RGB in 24 bits) of each colour of a palette (n×3 uint8)."""
    return mask_codes(np.asarray(palette, np.uint8).reshape(1, -1, 3))[0].astype(np.int64)


def code_of(value: LabelId) -> int:
    """The code ``mask_codes`` gives the mask value ``value`` (grey level or RGB triplet)."""
    if isinstance(value, tuple):
        return (value[0] << 16) | (value[1] << 8) | value[2]
    return int(value)


def value_of_code(code: int, colour: bool) -> LabelId:
    """The mask value that ``mask_codes`` packed into ``code`` (RGB for ``colour`` masks)."""
    if colour:
        return (code >> 16) & 255, (code >> 8) & 255, code & 255
    return int(code)


def shown_value(value: LabelId) -> str:
    """A mask value as a config writes it: ``7``, or ``[9, 9, 9]`` for a colour."""
    return f"[{value[0]}, {value[1]}, {value[2]}]" if isinstance(value, tuple) else str(value)


def label_values(entries: Sequence[Any], key: str = "datamodule.ignore_ids") -> list[LabelId]:
    """The mask values of a ``label_ids``/``ignore_ids`` list (entries may hold several).

    ``ConfigError`` naming ``key`` for an entry that is no mask value (see ``_values_of``).
    """
    return _values_of_list(entries, key)


def _values_of(entry: Any, key: str) -> list[LabelId]:
    """The mask values of one class: a grey level, an RGB triplet, or a list of those.

    Anything else (a string, a float, true) is refused naming ``key``: a string would
    otherwise be taken apart letter by letter, and a bool read as 0 or 1.
    """
    if _is_integer(entry):
        return [int(entry)]
    if isinstance(entry, str) or not isinstance(entry, Sequence):
        raise ConfigError(
            f"{key}: {entry!r} is not a mask value; expected a grey level (an integer), an "
            "RGB triplet ([r, g, b]) or a list of those"
        )
    entry = list(entry)
    if len(entry) == 3 and all(_is_integer(v) for v in entry):
        return [_triplet(entry)]
    return [v for item in entry for v in _values_of(item, key)]


def _values_of_list(entries: Sequence[Any], key: str) -> list[LabelId]:
    return [v for entry in entries for v in _values_of(entry, key)]


def _is_integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _triplet(entry: Sequence[int]) -> tuple[int, int, int]:
    if not all(0 <= int(v) <= 255 for v in entry):
        raise ConfigError(f"datamodule.label_ids: {list(entry)} is not an RGB triplet of 0-255")
    return int(entry[0]), int(entry[1]), int(entry[2])


def automatic_palette() -> np.ndarray:
    """The colours ``class_colours`` gives classes without any, in order (``n×3`` uint8).

    ``palette.distinct_colours`` for ``palette.GUARANTEED_CLASSES`` classes.
    """
    return distinct_colours(GUARANTEED_CLASSES)


def class_colours(colours: Sequence[Sequence[int]] | None, num_classes: int) -> np.ndarray:
    """RGB per class (``num_classes×3`` uint8): ``colours`` as given, then filled in.

    The classes beyond the given colours get ``palette.distinct_colours``: distinct in
    CIELAB from the given ones and from each other.
    """
    given = np.asarray(colours or [], np.uint8).reshape(-1, 3)[:num_classes]
    filled = distinct_colours(num_classes - len(given), given.tolist())
    return np.concatenate([given, filled]).astype(np.uint8)
