"""A tree's pairs and a split's part of a tree (the keys or folders a list names, a share).

Image/mask pairs of a tree: ``images`` and ``masks`` folders side by side, at any depth.

Aerial datasets come as the tiles of a survey, each with folders of its own (Humans in
the Loop's Dubai set: ``Tile 1/images/image_part_001.jpg`` ↔
``Tile 1/masks/image_part_001.png``, the same file names in every tile). Each folder
named ``images`` with a folder named ``masks`` beside it pairs as a split's two
folders do (``segscale.data.datasets.name_pairing``); a pair's key is its path in the
tree without the ``images``/``masks`` folder and without its extension:
``Tile 1/image_part_001``. The same key from two places (``a/images/b/c.jpg`` and
``a/b/images/c.jpg``) is a problem naming both. The folders found are
not searched for more: what lies below an ``images`` folder is its images.

A split's part of a tree's pairs: the keys or folders a list names, or a share.

A list names per line a key (``Tile 3/image_part_004``), the image's path in the tree
(``Tile 3/images/image_part_004.jpg``), or a folder of the tree (``Tile 3``: every pair
below it), the whole line taken as written: spaces need no quotes (quotes are allowed).
A share takes that part of the pairs, rounded, chosen by a digest of their keys: the
same pairs on every machine and for every seed; pairs added later take their places by
their own digests, so the pairs drawn before stay drawn but for those that new ones push
past the boundary.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath

import natsort

from segscale.data.datasets.lists import (
    QUOTES,
    ListedLine,
    read_list,
    windows_form,
    windows_parts,
)
from segscale.data.datasets.name_pairing import Naming, pair_folders
from segscale.data.storage.sources import IMAGE_SUFFIXES, FileProblem, ImageMaskPair


@dataclass(frozen=True)
class TreePair:
    """One pair of a tree and its key (``Tile 1/image_part_001``, with ``/`` everywhere)."""

    key: str
    pair: ImageMaskPair
    image_path: str
    """The image's path in the tree without its extension (``Tile 1/images/image_part_001``)."""


def tree_pairs(
    top: Path, images: str, masks: str, image_naming: Naming, mask_naming: Naming
) -> tuple[list[TreePair], list[FileProblem], int]:
    """The pairs of the tree under ``top``, its unpaired files, and its ``images`` folders.

    Pairs come in natural order of their keys (``Tile 2`` before ``Tile 10``). An
    ``images`` folder without a ``masks`` folder beside it, or the converse, is a
    problem (its files have nothing to pair with). The count of ``images`` folders
    paired lets the caller tell a tree without any from one whose files do not pair.
    """
    found: dict[str, TreePair] = {}
    problems: list[FileProblem] = []
    folders = 0
    for parent in _pair_folders(top, images, masks):
        image_dir, mask_dir = parent / images, parent / masks
        if not (image_dir.is_dir() and mask_dir.is_dir()):
            problems.append(_alone(image_dir, mask_dir))
            continue
        folders += 1
        pairs, unpaired = pair_folders(image_dir, mask_dir, image_naming, mask_naming)
        problems += unpaired
        where = PurePath(parent.relative_to(top))
        for pair in pairs:
            relative = pair.image.relative_to(image_dir)
            key = (where / str(image_naming.key(relative))).as_posix()
            if key in found:
                problems.append(_same_key(key, found[key].pair.image, pair.image))
                continue
            image_path = (where / images / relative.with_suffix("")).as_posix()
            found[key] = TreePair(key, pair, image_path)
    ordered = [found[key] for key in sorted(found, key=natsort.natsort_key)]
    return ordered, problems, folders


def _pair_folders(top: Path, images: str, masks: str) -> Iterator[Path]:
    """The folders under ``top`` (itself included) holding an ``images`` or ``masks`` folder.

    Hidden folders (``.git``, ``.ipynb_checkpoints``) are passed over, and the
    ``images``/``masks`` folders found are not searched further.
    """
    for folder, subfolders, _ in os.walk(top):
        subfolders[:] = sorted(
            (name for name in subfolders if not name.startswith(".")), key=natsort.natsort_key
        )
        if images in subfolders or masks in subfolders:
            yield Path(folder)
            subfolders[:] = [name for name in subfolders if name not in (images, masks)]


def _alone(image_dir: Path, mask_dir: Path) -> FileProblem:
    """The ``images`` (or ``masks``) folder that has no partner beside it."""
    present, missing = (image_dir, mask_dir) if image_dir.is_dir() else (mask_dir, image_dir)
    return FileProblem(
        present,
        f"no {missing.name}/ folder beside it, in {missing.parent}: its files pair with nothing",
        f"{image_dir.name}/ or {mask_dir.name}/ folders alone",
    )


def _same_key(key: str, first: Path, second: Path) -> FileProblem:
    """``second`` has the key of ``first``, found in another folder of the tree."""
    return FileProblem(
        second,
        f"its key {key!r} is also that of {first}: two images at one place of the tree; keep one",
        "images that share their key in the tree",
    )


def listed_pairs(
    pairs: Sequence[TreePair], listing: Path, top: Path
) -> tuple[list[TreePair], list[str], list[FileProblem]]:
    """The pairs ``listing`` names, in its order, with the line of each; its bad lines.

    A line that names nothing in the tree (under ``top``) is a problem naming the line.
    A pair named twice (by its key, and by its folder) comes twice: the caller's check
    of repeated pairs names both lines.
    """
    chosen: list[TreePair] = []
    places: list[str] = []
    problems: list[FileProblem] = []
    for line in read_list(listing):
        if line.problem:
            problems.append(FileProblem(Path(line.where), line.problem, _kind(listing, "read")))
            continue
        named = _named(line)
        found = _matching(named, pairs)
        if not found and windows_form(named):
            found = _matching("/".join(windows_parts(named)), pairs)
        if not found:
            problems.append(_unknown(line, named, pairs, listing, top))
        chosen += found
        places += [line.where] * len(found)
    return chosen, places, problems


def shared_pairs(pairs: Sequence[TreePair], share: float) -> list[TreePair]:
    """``share`` of ``pairs`` (at least one), ranked by a digest of their keys; in tree order."""
    count = max(1, round(share * len(pairs)))
    ranked = sorted(pairs, key=lambda pair: _rank(pair.key))
    keys = {pair.key for pair in ranked[:count]}
    return [pair for pair in pairs if pair.key in keys]


def _rank(key: str) -> bytes:
    """A key's place in the draw of a share: the same on every machine (BLAKE2b of UTF-8)."""
    return hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()


def _named(line: ListedLine) -> str:
    """What a line of a tree's list names: its one field in quotes, or the whole line."""
    quoted = len(line.fields) == 1 and line.text[:1] in QUOTES
    return (line.fields[0] if quoted else line.text).removeprefix("./").rstrip("/")


def _matching(named: str, pairs: Sequence[TreePair]) -> list[TreePair]:
    """The pairs ``named`` names: by key, by the image's path, or as a folder above them."""
    path = PurePosixPath(named)
    stem = str(path.with_suffix("")) if path.suffix.lower() in IMAGE_SUFFIXES else named
    exact = [pair for pair in pairs if stem in (pair.key, pair.image_path)]
    return exact or [pair for pair in pairs if pair.key.startswith(named + "/")]


def _unknown(
    line: ListedLine, named: str, pairs: Sequence[TreePair], listing: Path, top: Path
) -> FileProblem:
    example = f" (its keys are such as {pairs[0].key!r})" if pairs else ""
    return FileProblem(
        Path(line.where),
        f"{named!r} is no key, image or folder of the tree {top}{example}",
        _kind(listing, "name nothing in the tree"),
    )


def _kind(listing: Path, what: str) -> str:
    return f"lines of {listing.name} that {what}"
