"""Pairs that name one file twice: a pair listed twice, a mask given as an image.

A list may name one file in several ways (relative, absolute, through a link), so files
are told apart by what they are on disk (device and inode), not by how they are named.
A repeated pair would be trained on twice as often as the others, silently; a mask read
as an image trains the network to copy its input. One image with two masks (two
annotators') is two pairs, and not refused; nor is one mask shared by two images (two
dates of one place).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from segscale.data.storage.sources import FileProblem, ImageMaskPair


def repeated_files(pairs: Sequence[ImageMaskPair], places: Sequence[str]) -> list[FileProblem]:
    """The pairs that repeat an earlier one, or hold a mask as an image, each at its place.

    ``places``: where each pair is given, parallel to ``pairs`` (``<list>:<line>``, or the
    image file of a pair found in folders); each problem is a ``FileProblem`` of the
    later place, naming the earlier one.
    """
    masks = {file_identity(pair.mask): place for pair, place in zip(pairs, places, strict=True)}
    seen: dict[tuple[object, object], str] = {}
    problems = []
    for pair, place in zip(pairs, places, strict=True):
        image, mask = file_identity(pair.image), file_identity(pair.mask)
        if image == mask:
            problems.append(
                FileProblem(
                    Path(place),
                    f"{pair.image} is given as the image and its own mask; expected an image, "
                    "then the mask of its classes",
                    "pairs whose image is their own mask",
                )
            )
        elif image in masks:
            problems.append(
                FileProblem(
                    Path(place),
                    f"its image {pair.image} is the mask at {masks[image]}; expected an image, "
                    "then the mask of its classes",
                )
            )
        elif (image, mask) in seen:
            problems.append(
                FileProblem(
                    Path(place),
                    f"repeats the pair at {seen[image, mask]} ({pair.image.name}, "
                    f"{pair.mask.name}): it would be trained on twice as often; list it once",
                    "pairs listed twice",
                )
            )
        else:
            seen[image, mask] = place
    return problems


def file_identity(path: Path) -> object:
    """What ``path`` is on disk: its device and inode; its resolved path if it has none."""
    try:
        stat = os.stat(path)
    except OSError:  # a dangling link, reported as such by the pass
        return path.resolve()
    return (stat.st_dev, stat.st_ino)
