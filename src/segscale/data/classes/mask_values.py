"""A census of mask values over many files: pixels and files per grey level or colour.

The validation pass takes one of the values no class claims, to report them in one
table instead of one line per file; ``datamodule/classes=auto`` takes one of the
training masks' values, to make them the classes (``segscale.data.classes.class_discovery``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from segscale.data.classes.labels import LabelId, shown_value, value_of_code

MAX_ROWS = 20
"""Values a table shows (those with the most pixels); the rest are counted in one line."""
MAX_EXAMPLES = 3
"""Files named per value."""


@dataclass
class MaskValueCensus:
    """Per mask value (as ``mask_codes`` packs it): its pixels and the files that hold it.

    ``colour``: the values are RGB colours (else grey levels or class indices).
    ``palette_files``: the files counted that are palette masks (their colours counted
    for ``colour``, else their indices; ``segscale.data.classes.palette``).
    """

    colour: bool
    pixels: dict[int, int] = field(default_factory=dict)
    files: dict[int, list[Path]] = field(default_factory=dict)
    palette_files: dict[Path, None] = field(default_factory=dict)

    def add(
        self, path: Path, codes: Iterable[int], counts: Iterable[int], palette: bool = False
    ) -> None:
        """Count the values (``codes``) of the file ``path``, ``counts`` pixels of each.

        ``palette``: ``path`` is a palette mask (``codes`` as its values were read).
        """
        for code, count in zip(codes, counts, strict=True):
            code, count = int(code), int(count)
            self.pixels[code] = self.pixels.get(code, 0) + count
            self.files.setdefault(code, []).append(path)
        if palette:
            self.palette_files[path] = None

    @property
    def kind(self) -> str:
        """The masks' kind in words: ``RGB colours``, ``grey levels``, with their palette masks."""
        return masks_kind(self.colour, len(self.palette_files))

    def palette_lines(self, indent: int = 2) -> list[str]:
        """How the palette masks among the files were read, naming a few (none: no line)."""
        if not self.palette_files:
            return []
        base = _common_folder(self.all_files)
        names = [_relative(p, base) for p in list(self.palette_files)[:MAX_EXAMPLES]]
        more = ", ..." if len(self.palette_files) > MAX_EXAMPLES else ""
        count = len(self.palette_files)
        which = f"{count} of these masks are palette masks"
        its = "their palettes"
        if count == 1:
            which, its = "1 of these masks is a palette mask", "its palette"
        how = (
            f"by the colours of {its}, as the classes are colours"
            if self.colour
            else "by index, as the classes are not colours (RGB triplets in "
            "datamodule.label_ids read palette masks by their colours)"
        )
        return [f"{' ' * indent}{which}, read {how}: {', '.join(names)}{more}"]

    @property
    def codes(self) -> list[int]:
        """The values found, as codes, in ascending order."""
        return sorted(self.pixels)

    def value(self, code: int) -> LabelId:
        """The mask value of ``code``: a grey level or an RGB triplet."""
        return value_of_code(code, self.colour)

    @property
    def all_files(self) -> list[Path]:
        """Every file that holds one of the values, each once, in the order first seen."""
        return list(dict.fromkeys(path for paths in self.files.values() for path in paths))

    def __len__(self) -> int:
        return len(self.pixels)

    def table(self, indent: int = 2) -> str:
        """The values as a printable table: value, pixels, files, a few file names.

        Up to ``MAX_ROWS`` values (those with the most pixels, in ascending order of
        value); file names are relative to the folder all the files are in. Each line
        starts with ``indent`` spaces.
        """
        shown = sorted(sorted(self.pixels, key=lambda c: -self.pixels[c])[:MAX_ROWS])
        base = _common_folder(self.all_files)
        names = {c: [_relative(p, base) for p in self.files[c][:MAX_EXAMPLES]] for c in shown}
        values = {c: shown_value(self.value(c)) for c in shown}
        width = max(len("value"), *(len(v) for v in values.values()))
        pad = " " * indent
        lines = [f"{pad}{'value':<{width}}  {'pixels':>13}  {'files':>6}  e.g. (in {base})"]
        for code in shown:
            more = ", ..." if len(self.files[code]) > MAX_EXAMPLES else ""
            lines.append(
                f"{pad}{values[code]:<{width}}  {self.pixels[code]:>13,}  "
                f"{len(self.files[code]):>6}  {', '.join(names[code])}{more}"
            )
        rest = [c for c in self.pixels if c not in shown]
        if rest:
            pixels = sum(self.pixels[c] for c in rest)
            lines.append(f"{pad}... and {len(rest)} more values ({pixels:,} pixels)")
        return "\n".join(lines)

    def override_list(self, limit: int = 10) -> str:
        """The values as a config list (``[6, 8]``, ``[[9, 9, 9]]``), ``...`` past ``limit``."""
        shown = [shown_value(self.value(c)) for c in self.codes]
        return f"[{', '.join(shown)}]" if len(shown) <= limit else "[...]"


def masks_kind(colour: bool, palette_masks: int) -> str:
    """Masks of colours or not in words, with how many palette masks were read so."""
    return ("RGB colours" if colour else "grey levels") + palette_note(colour, palette_masks)


def palette_note(colour: bool, palette_masks: int) -> str:
    """`` (3 palette masks read by their palettes' colours)``, or "" without any."""
    if not palette_masks:
        return ""
    how = "by their palettes' colours" if colour else "by index"
    return f" ({palette_masks} palette mask(s) read {how})"


def _common_folder(paths: list[Path]) -> Path:
    if not paths:
        return Path(".")
    return Path(os.path.commonpath([str(p.parent) for p in paths]))


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)
