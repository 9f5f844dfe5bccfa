"""A split's list file paired: one-name lines in the image and mask folders, two-path lines.

The list's text and its fields are ``segscale.data.datasets.list_files``'; here each line becomes
a pair or the problem that names it: a name looked up by key (``Naming``) in the image
folder and paired with the mask folder, or an image path and its mask path.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from segscale.data.datasets.list_files import (
    QUOTES,
    SPACES_HINT,
    ListedLine,
    read_list,
    resolve_listed,
    windows_form,
    windows_hint,
    windows_parts,
)
from segscale.data.datasets.name_pairing import Naming, files_by_key, unusable
from segscale.data.datasets.repeated_files import repeated_files
from segscale.data.storage.sources import IMAGE_SUFFIXES, MASK_SUFFIXES, FileProblem, ImageMaskPair
from segscale.platforms.files import folds_case

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
