r"""A split's list file: its text, its fields, its paths, and its lines paired.

A list file holds one image name per line, or an image path and its mask path.

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

A path with spaces (``Tile 1/images/image_part_001.jpg``, as aerial datasets name their
folders) is written in quotes, ``"..."`` or ``'...'``, or the line's fields are separated
by tabs (a spreadsheet's text export): ``split_fields`` reads both. Quotes count only
around a whole field, so an apostrophe inside a name (``O'Brien.png``) stays a letter;
there are no escapes (a backslash is Windows' separator). ``#`` outside quotes starts a
comment.

A split's list file paired: one-name lines in the image and mask folders, two-path lines.

The list's text and its fields are read as above; here each line becomes
a pair or the problem that names it: a name looked up by key (``Naming``) in the image
folder and paired with the mask folder, or an image path and its mask path.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PureWindowsPath

from segscale.data.datasets.name_pairing import Naming, files_by_key, repeated_files, unusable
from segscale.data.storage.sources import IMAGE_SUFFIXES, MASK_SUFFIXES, FileProblem, ImageMaskPair
from segscale.errors import ConfigError
from segscale.platforms.files import folds_case

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


QUOTES = ('"', "'")
"""The quotes a field with spaces may be written in."""
SPACES_HINT = (
    'a path with spaces goes in quotes ("Tile 1/images/a.jpg" "Tile 1/masks/a.png"), or '
    "the line's fields are separated by a tab"
)
"""How a list holds a path with spaces, for messages."""


@dataclass(frozen=True)
class ListedLine:
    """One entry of a list file: where it is (``<list>:<line number>``) and its fields.

    ``text``: the line without its comment, stripped (a tree's list takes it whole, as
    one key). ``problem``: why its fields cannot be read (a quote left open); its
    ``fields`` are then those read before it.
    """

    where: str
    fields: tuple[str, ...]
    text: str = ""
    problem: str = ""


def read_list(listing: Path) -> list[ListedLine]:
    """The entries of ``listing`` (``split_fields``); blank lines and ``#`` comments skipped."""
    entries = []
    for number, line in enumerate(read_list_text(listing).splitlines(), 1):
        fields, text, problem = split_fields(line)
        if fields or problem:
            entries.append(ListedLine(f"{listing}:{number}", fields, text, problem))
    return entries


def split_fields(line: str) -> tuple[tuple[str, ...], str, str]:
    """The fields of one line of a list, its text before the comment, and its problem.

    Fields are separated by tabs where the line has one (each stripped of the spaces
    around it), else by spaces. A field that starts with a quote runs to the same
    quote, which must end the field; ``#`` outside quotes starts a comment. The problem
    is ``""`` unless a quote is left open, or is followed by more of its field.
    """
    separators = "\t" if "\t" in line else " \t\f\v"
    fields: list[str] = []
    position, end = 0, len(line)
    while True:
        while position < end and line[position].isspace():
            position += 1
        if position == end or line[position] == "#":
            return tuple(fields), line[:position].strip(), ""
        if line[position] in QUOTES:
            close = line.find(line[position], position + 1)
            if close < 0:
                return tuple(fields), line.strip(), _open_quote(line, position)
            if close + 1 < end and not (line[close + 1].isspace() or line[close + 1] == "#"):
                return tuple(fields), line.strip(), _after_quote(line, close + 1)
            fields.append(line[position + 1 : close])
            position = close + 1
            continue
        start = position
        while position < end and line[position] not in separators and line[position] != "#":
            position += 1
        fields.append(line[start:position].strip())


def _open_quote(line: str, position: int) -> str:
    return (
        f"the quote {line[position]} at column {position + 1} is not closed; expected a "
        "field in quotes to end with the same quote"
    )


def _after_quote(line: str, position: int) -> str:
    return (
        f"{line[position:].split()[0]!r} follows the closing quote at column {position}; "
        "expected a space or a tab after a field in quotes"
    )


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


LIST_BASES = "the list's folder or datamodule.source.root"
"""What the paths of a list start from, in words (messages)."""


def pair_listed(
    listing: Path,
    root: Path,
    images: Path,
    masks: Path,
    image_naming: Naming,
    mask_naming: Naming,
) -> tuple[list[ImageMaskPair], list[FileProblem]]:
    """Pair the lines of ``listing``: a name each, or an image and a mask path.

    A name is looked up under ``images`` and paired with ``masks`` by key; a path under
    the list's folder or ``root`` (``resolve_listed``). Returns the pairs in the list's
    order and every line's problem: one that cannot be read, names nothing, or repeats
    a pair (``repeated_files``).
    """
    bases = tuple(dict.fromkeys((listing.parent, root)))
    named = _NamedFiles(images, masks, image_naming, mask_naming)
    pairs: list[ImageMaskPair] = []
    places: list[str] = []
    problems: list[FileProblem] = []
    for line in read_list(listing):
        found: ImageMaskPair | FileProblem | None
        if line.problem:
            kind = f"lines of {listing.name} that cannot be read"
            found = FileProblem(Path(line.where), line.problem, kind)
        elif len(line.fields) == 2:
            found = _listed_pair(line, bases, listing.name)
        elif len(line.fields) == 1:
            found = named.pair(line, listing.name)
        else:
            found = FileProblem(
                Path(line.where),
                f"{len(line.fields)} fields; expected an image name, or an image path "
                f"and its mask path ({SPACES_HINT})",
                kind=f"lines of {listing.name} that are neither",
            )
        if isinstance(found, ImageMaskPair):
            pairs.append(found)
            places.append(line.where)
        elif found is not None:
            problems.append(found)
    return pairs, named.problems + problems + repeated_files(pairs, places)


class _NamedFiles:
    """The files of a list's one-name lines: its image and mask folders, read when needed."""

    def __init__(
        self, images: Path, masks: Path, image_naming: Naming, mask_naming: Naming
    ) -> None:
        self.images = images
        self.masks = masks
        self.image_naming = image_naming
        self.mask_naming = mask_naming
        self.problems: list[FileProblem] = []
        self.explained: set[str] = set()
        self._by_key: tuple[dict[str, Path], dict[str, Path]] | None = None
        self._fold = False  # names in any case (set with _by_key: files_by_key)

    def pair(self, line: ListedLine, list_name: str) -> ImageMaskPair | FileProblem | None:
        """The pair that ``line`` names, its problem, or ``None`` if reported already."""
        if self._by_key is None:
            self._fold = folds_case(self.images) or folds_case(self.masks)
            self._by_key = (
                files_by_key(
                    self.images, self.image_naming, self.problems, self.explained, self._fold
                ),
                files_by_key(
                    self.masks, self.mask_naming, self.problems, self.explained, self._fold
                ),
            )
        images, masks = self._by_key
        name = line.fields[0]
        key = self._key(name)
        if key not in images and windows_form(name):  # a name written on Windows
            parts = windows_parts(name)
            tails = (self._key("/".join(parts[start:])) for start in range(len(parts)))
            key = next((tail for tail in tails if tail in images), key)
        if key in self.explained and (key not in images or key not in masks):
            return None  # its unusable image or mask is listed already
        if key not in images:
            where = self.images
            kind = f"names in {list_name} with no image in {where}"
            hint = f"; {windows_hint(f'the image folder {where}')}" if windows_form(name) else ""
            return FileProblem(Path(line.where), f"no image {name!r} in {where}{hint}", kind)
        if key not in masks:
            where = self.masks
            kind = f"images listed in {list_name} without a mask in {where}"
            return FileProblem(images[key], f"no mask for it in {where}", kind)
        return ImageMaskPair(images[key], masks[key])

    def _key(self, name: str) -> str:
        """The pairing key of a listed name (one without the name suffix: as it is)."""
        key = self.image_naming.key(Path(name))
        key = key or replace(self.image_naming, name_suffix="").key(Path(name)) or name
        return key.casefold() if self._fold else key


def _listed_pair(
    line: ListedLine, bases: tuple[Path, ...], list_name: str
) -> ImageMaskPair | FileProblem:
    """The image and mask that a two-path line names, or why they cannot be used."""
    found = []
    for text, formats, what in zip(
        line.fields, (IMAGE_SUFFIXES, MASK_SUFFIXES), ("image", "mask"), strict=True
    ):
        path = resolve_listed(text, bases)
        if path is None:
            under = " or ".join(str(base) for base in bases)
            reason = (
                f"{what} {text!r} not found, as written nor by its trailing parts under {under}"
            )
            if windows_form(text):
                parts = "/".join(windows_parts(text))
                reason += f" (nor as {parts}); {windows_hint(LIST_BASES)}"
            elif _spaced_path(line, bases):
                reason += f"; {_spaced_path(line, bases)!r} is there: {SPACES_HINT}"
            return FileProblem(
                Path(line.where), reason, f"lines of {list_name} whose {what} is missing"
            )
        why = unusable(path, formats)
        if why:
            return FileProblem(path, f"{why} (listed at {line.where})")
        found.append(path)
    return ImageMaskPair(found[0], found[1])


def _spaced_path(line: ListedLine, bases: tuple[Path, ...]) -> str:
    """The first fields of ``line`` joined by spaces where they name a file; else ``""``.

    A path with spaces written bare (``Tile 1/images/a.jpg``) splits into fields; the
    message then says how to write it.
    """
    if "\t" in line.text or any(quote in line.text for quote in QUOTES):
        return ""
    for count in range(2, len(line.fields) + 1):
        joined = " ".join(line.fields[:count])
        if resolve_listed(joined, bases) is not None:
            return joined
    return ""
