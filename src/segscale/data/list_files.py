"""A split's list file: one image name per line, or an image path and its mask path.

Two-path lines are the layout CamVid and Pascal VOC are distributed in (``train.txt``:
``train/a.png trainannot/a.png``). Lists written on another machine hold that machine's
paths (CamVid's: ``/SegNet/CamVid/train/a.png``), so a listed path that does not exist
as written is looked for by its trailing parts under the list's folder and the dataset
root, the longest first: ``/SegNet/CamVid/train/a.png`` finds ``<root>/train/a.png``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ListedLine:
    """One entry of a list file: where it is (``<list>:<line number>``) and its fields."""

    where: str
    fields: tuple[str, ...]


def read_list(listing: Path) -> list[ListedLine]:
    """The entries of ``listing``, split on whitespace; blank lines and ``#`` comments skipped."""
    entries = []
    for number, line in enumerate(listing.read_text().splitlines(), 1):
        fields = tuple(line.split("#", 1)[0].split())
        if fields:
            entries.append(ListedLine(f"{listing}:{number}", fields))
    return entries


def resolve_listed(text: str, bases: Sequence[Path]) -> Path | None:
    """The file a listed path names; ``None`` if there is none.

    The path as written when it exists (absolute, or under the first of ``bases`` that
    holds it); else its trailing parts under one of ``bases``, the longest first.
    """
    path = Path(text)
    if path.is_absolute() and _present(path):
        return path
    parts = path.parts[1:] if path.is_absolute() else path.parts
    for start in range(len(parts)):
        tail = Path(*parts[start:])
        for base in bases:
            if _present(base / tail):
                return base / tail
    return None


def _present(path: Path) -> bool:
    """Whether ``path`` is there, a dangling link included (it is reported as one later)."""
    return path.exists() or path.is_symlink()
