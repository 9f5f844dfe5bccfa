"""Image files paired with mask files by name: keys, pairs, misfits, files named twice.

Pairing image files with mask files by name: the key of each file, the pairs, the misfits.

Pairs that name one file twice: a pair listed twice, a mask given as an image.

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
from dataclasses import dataclass
from pathlib import Path

from segscale.data.storage.sources import IMAGE_SUFFIXES, FileProblem, ImageMaskPair
from segscale.platforms.files import folds_case


@dataclass(frozen=True)
class Naming:
    """How files of one kind (images or masks) are found and keyed for pairing.

    The key of a file is its path below its folder without the extension and without
    ``name_suffix`` (Cityscapes' ``_leftImg8bit``; it may include the extension, as
    ``_leftImg8bit.png``). With a ``name_suffix``, files whose names do not end with it
    are not of this kind and are passed over (``_gtFine_color.png`` beside the masks).
    """

    what: str
    formats: tuple[str, ...]
    name_suffix: str
    suffix_key: str

    def key(self, relative: Path) -> str | None:
        """The pairing key of ``relative``; ``None`` when its name lacks ``name_suffix``."""
        stem = relative.with_suffix("") if relative.suffix.lower() in IMAGE_SUFFIXES else relative
        if not self.name_suffix:
            return str(stem)
        for name in (relative.name, stem.name):
            if name.endswith(self.name_suffix):
                return str(relative.parent / name.removesuffix(self.name_suffix))
        return None


def pair_folders(
    image_dir: Path, mask_dir: Path, image_naming: Naming, mask_naming: Naming
) -> tuple[list[ImageMaskPair], list[FileProblem]]:
    """Pair every image under ``image_dir`` with the mask of the same key under ``mask_dir``.

    Keys match in any case where either folder's file system finds names in any case
    (Windows, macOS: ``IMG_01.JPG`` pairs with ``img_01.png``), as they do there.
    """
    problems: list[FileProblem] = []
    explained: set[str] = set()
    fold = folds_case(image_dir) or folds_case(mask_dir)
    images = files_by_key(image_dir, image_naming, problems, explained, fold)
    masks = files_by_key(mask_dir, mask_naming, problems, explained, fold)
    pairs = [ImageMaskPair(images[k], masks[k]) for k in sorted(images) if k in masks]
    problems += [
        FileProblem(
            images[k], f"no mask for it in {mask_dir}", f"images without a mask in {mask_dir}"
        )
        for k in sorted(images)
        if k not in masks and k not in explained
    ]
    problems += [
        FileProblem(
            masks[k], f"no image for it in {image_dir}", f"masks without an image in {image_dir}"
        )
        for k in sorted(masks)
        if k not in images and k not in explained
    ]
    return pairs, problems


def files_by_key(
    folder: Path,
    naming: Naming,
    problems: list[FileProblem],
    explained: set[str],
    fold: bool = False,
) -> dict[str, Path]:
    """Files under ``folder`` of ``naming``'s kind, by their pairing key (``Naming.key``).

    ``fold``: the keys in one case (``str.casefold``), for a file system that finds
    names in any case (``segscale.platforms.files.folds_case``).

    A second file with the same key (``a.png`` and ``a.tif``) is ambiguous: it is added
    to ``problems`` and left out. So is an entry named like an image that cannot be
    used (``unusable``), with what it is; its key goes into ``explained``, so that its
    partner is not also reported as unpaired. A folder whose files all lack
    ``naming.name_suffix`` is a problem too.
    """
    found: dict[str, Path] = {}
    passed_over: list[Path] = []
    for path in sorted(folder.rglob("*")):
        if path.name.startswith(".") or path.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        key = naming.key(path.relative_to(folder))
        if key is None:
            passed_over.append(path)
            continue
        if fold:
            key = key.casefold()
        reason = unusable(path, naming.formats)
        if reason:
            problems.append(FileProblem(path, reason))
            explained.add(key)
        elif key in found:
            problems.append(FileProblem(path, f"same name as {found[key].name}; keep one"))
        else:
            found[key] = path
    if passed_over and not found:
        problems.append(
            FileProblem(
                folder,
                f"no {naming.what} file name ends with datamodule.source.{naming.suffix_key}="
                f"{naming.name_suffix!r} ({len(passed_over)} files such as "
                f"{passed_over[0].name} do not)",
            )
        )
    return found


def unusable(path: Path, formats: tuple[str, ...]) -> str | None:
    """Why ``path`` is no file of ``formats``; ``None`` if it is one."""
    if path.is_symlink() and not path.exists():
        return f"a link to {path.readlink()}, which does not exist"
    if path.is_dir():
        return "a folder, not an image file; rename or move it"
    if not path.is_file():
        return "not a regular file (a device, a pipe or a socket)"
    names = "/".join(s.lstrip(".").upper() for s in formats)
    if path.suffix.lower() in IMAGE_SUFFIXES and path.suffix.lower() not in formats:
        return (  # an image format masks may not have
            f"a {path.suffix.lstrip('.').upper()} mask; masks must be {names} (lossy "
            "compression changes the label values)"
        )
    if path.suffix.lower() not in formats:
        return f"not an image file by its name; expected {names}"
    return None


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
