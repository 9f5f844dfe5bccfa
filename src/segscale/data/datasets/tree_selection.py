"""A split's part of a tree's pairs: the keys or folders a list names, or a share.

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
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from segscale.data.datasets.list_files import (
    QUOTES,
    ListedLine,
    read_list,
    windows_form,
    windows_parts,
)
from segscale.data.datasets.tree_pairing import TreePair
from segscale.data.storage.sources import IMAGE_SUFFIXES, FileProblem


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
