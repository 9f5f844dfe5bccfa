r"""A split's list file: one image name per line, or an image path and its mask path.

Two-path lines are the layout CamVid and Pascal VOC are distributed in (``train.txt``:
``train/a.png trainannot/a.png``). Lists written on another machine hold that machine's
paths (CamVid's: ``/SegNet/CamVid/train/a.png``), so a listed path that does not exist
as written is looked for by its trailing parts under the list's folder and the dataset
root, the longest first: ``/SegNet/CamVid/train/a.png`` finds ``<root>/train/a.png``.

Lists written on Windows are read as such: UTF-8 with or without a byte-order mark
(Notepad's), or UTF-16 with one (PowerShell's ``>``), CRLF line ends; a path in
Windows' form (``train\a.png``, ``D:\CamVid\train\a.png``) that does not exist as
written is looked for by its parts, as another machine's path is. Only then: on Linux a
backslash is a character of a file name, and a file that has one is the one meant.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath

from segscale.errors import ConfigError

WINDOWS_DRIVE = re.compile(r"(?:^|/)[A-Za-z]:[\\/]")
r"""A drive letter (``D:\``, ``D:/``) at the start of a path, or joined below a folder."""


def windows_hint(relative_to: str) -> str:
    """What a listed path in Windows' form that is nowhere to be found is told.

    ``relative_to``: what the list's relative paths start from, in words.
    """
    return (
        "the list looks written on Windows (backslashes, a drive letter); expected forward "
        f"slashes and paths relative to {relative_to} (tiles/a.png), which a list written "
        "on any system can hold"
    )


@dataclass(frozen=True)
class ListedLine:
    """One entry of a list file: where it is (``<list>:<line number>``) and its fields."""

    where: str
    fields: tuple[str, ...]


def read_list(listing: Path) -> list[ListedLine]:
    """The entries of ``listing``, split on whitespace; blank lines and ``#`` comments skipped."""
    entries = []
    for number, line in enumerate(read_list_text(listing).splitlines(), 1):
        fields = tuple(line.split("#", 1)[0].split())
        if fields:
            entries.append(ListedLine(f"{listing}:{number}", fields))
    return entries


def read_list_text(listing: Path) -> str:
    """The text of a list file: UTF-8 (a byte-order mark dropped), or UTF-16 with its mark.

    Raises ``ConfigError`` naming ``listing`` for any other encoding (a Windows code
    page's accented letters), rather than guess what its bytes mean.
    """
    data = listing.read_bytes()
    utf16 = data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    try:
        return data.decode("utf-16" if utf16 else "utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{listing}: not UTF-8 text (byte {error.start} is {data[error.start]:#04x}); "
            "expected a list saved as UTF-8 (or UTF-16 with a byte-order mark)"
        ) from None


def resolve_listed(text: str, bases: Sequence[Path]) -> Path | None:
    """The file a listed path names; ``None`` if there is none.

    The path as written when it exists (absolute, or under the first of ``bases`` that
    holds it); else its trailing parts under one of ``bases``, the longest first; else,
    for a path in Windows' form (``windows_form``), its Windows parts the same way.
    """
    path = Path(text)
    if path.is_absolute() and _present(path):
        return path
    found = _by_trailing_parts(path.parts[1:] if path.is_absolute() else path.parts, bases)
    if found is None and windows_form(text):
        found = _by_trailing_parts(windows_parts(text), bases)
    return found


def windows_form(text: str) -> bool:
    """Whether a listed path is written as on Windows: a backslash, or a drive letter."""
    return "\\" in text or WINDOWS_DRIVE.search(text) is not None


def windows_parts(text: str) -> tuple[str, ...]:
    r"""The parts of a Windows path below its drive or share: ``D:\t\a.png`` → ``t``, ``a.png``."""
    path = PureWindowsPath(text)
    return path.parts[1:] if path.anchor else path.parts


def _by_trailing_parts(parts: Sequence[str], bases: Sequence[Path]) -> Path | None:
    """``parts``, or the longest of their tails, under the first of ``bases`` that holds it."""
    for start in range(len(parts)):
        tail = Path(*parts[start:])
        for base in bases:
            if _present(base / tail):
                return base / tail
    return None


def _present(path: Path) -> bool:
    """Whether ``path`` is there, a dangling link included (it is reported as one later)."""
    return path.exists() or path.is_symlink()
