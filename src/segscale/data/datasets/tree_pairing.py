"""Image/mask pairs of a tree: ``images`` and ``masks`` folders side by side, at any depth.

Aerial datasets come as the tiles of a survey, each with folders of its own (Humans in
the Loop's Dubai set: ``Tile 1/images/image_part_001.jpg`` ↔
``Tile 1/masks/image_part_001.png``, the same file names in every tile). Each folder
named ``images`` with a folder named ``masks`` beside it pairs as a split's two folders
do (``segscale.data.datasets.name_pairing``); a pair's key is its path in the tree without the
``images``/``masks`` folder and without its extension: ``Tile 1/image_part_001``. The
same key from two places (``a/images/b/c.jpg`` and ``a/b/images/c.jpg``) is a problem
naming both. The folders found are not searched for more: what lies below an
``images`` folder is its images.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath

from segscale.data.datasets.name_pairing import Naming, pair_folders
from segscale.data.storage.sources import FileProblem, ImageMaskPair
from segscale.natural_order import natural_key


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
    ordered = [found[key] for key in sorted(found, key=natural_key)]
    return ordered, problems, folders


def _pair_folders(top: Path, images: str, masks: str) -> Iterator[Path]:
    """The folders under ``top`` (itself included) holding an ``images`` or ``masks`` folder.

    Hidden folders (``.git``, ``.ipynb_checkpoints``) are passed over, and the
    ``images``/``masks`` folders found are not searched further.
    """
    for folder, subfolders, _ in os.walk(top):
        subfolders[:] = sorted(
            (name for name in subfolders if not name.startswith(".")), key=natural_key
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
