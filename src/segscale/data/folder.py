"""A dataset of the user's own files: an image folder and a mask folder, paired by name."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from segscale.data.sources import IMAGE_SUFFIXES, MASK_SUFFIXES, FileProblem, ImageMaskPair
from segscale.errors import ConfigError


@dataclass(frozen=True)
class FolderTiles:
    """Images and masks paired by file stem: ``images/a.png`` ↔ ``masks/a.png``.

    Each entry of ``splits`` (``train``, ``val``, ``test``) names, under ``root``, either

    - a folder with its own ``images``/``masks`` subfolders
      (``train/images/a.png`` ↔ ``train/masks/a.png``), or
    - a text file (``.txt``) listing the split's images, one per line, as stems or paths
      relative to ``root/images`` (``a``, ``a.png`` or ``zone1/a.tif``), paired with
      ``root/masks`` the same way; blank lines and ``#`` comments are skipped.

    A name without suffix finds either: ``test`` is the folder ``root/test`` or, if
    there is none, the list ``root/test.txt``. A split is looked for only when it is
    read (training reads ``train`` and ``val``; ``evaluate.py split=test`` reads
    ``test``), so a missing test split is no error until then.

    Subfolders are followed; the pairing key is the path below ``images``/``masks``
    without its suffix, so an image and its mask may differ in format (``a.jpg`` ↔
    ``a.png``). Images: PNG, JPEG, TIFF; masks: PNG, TIFF.
    """

    root: str
    images: str = "images"
    masks: str = "masks"
    splits: Mapping[str, str | None] = field(
        default_factory=lambda: {"train": "train", "val": "val", "test": "test"}
    )

    @property
    def cache_key(self) -> str:
        """The resolved root, subfolder names and splits: the validation cache's key."""
        settings = {
            "root": str(Path(self.root).resolve()),
            "images": self.images,
            "masks": self.masks,
            "splits": dict(self.splits),
        }
        return json.dumps(settings, sort_keys=True)

    def prepare(self) -> None:
        """Check that the dataset folder exists (each split is checked when scanned)."""
        if not Path(self.root).is_dir():
            raise ConfigError(
                f"datamodule.source.root={self.root!r} is not a folder; expected the "
                "dataset folder holding the images and masks"
            )

    def has_split(self, split: str) -> bool:
        """Whether ``split`` is configured (``scan`` finds its folder or list, or says so)."""
        return bool(self.splits.get(split))

    def pairs(self, split: str) -> list[ImageMaskPair]:
        """The complete image/mask pairs of ``split``, in name order."""
        return self.scan(split)[0]

    def problems(self, split: str) -> list[FileProblem]:
        """Files of ``split`` that cannot be paired: an image without mask, and so on."""
        return self.scan(split)[1]

    def scan(self, split: str) -> tuple[list[ImageMaskPair], list[FileProblem]]:
        """Pair the files of ``split``; return the pairs and the files left unpaired."""
        entry = self.splits.get(split)
        if not entry:
            raise ConfigError(
                f"datamodule.source.splits.{split} is not set; expected a folder under "
                f"{self.root} (with {self.images}/ and {self.masks}/) or a .txt list"
            )
        location = self._location(split, entry)
        if location.is_file():
            image_dir, mask_dir = Path(self.root) / self.images, Path(self.root) / self.masks
            return self._pair_listed(location, image_dir, mask_dir)
        return _pair_folders(location / self.images, location / self.masks)

    def _location(self, split: str, entry: str) -> Path:
        """The folder or list that ``splits[split]`` names (``entry``: its value)."""
        location = Path(self.root) / entry
        if location.exists():
            return location
        if location.suffix:
            raise ConfigError(
                f"datamodule.source.splits.{split}={entry!r}: {location} does not exist; "
                "expected a folder or a .txt list of image names"
            )
        listing = location.with_name(f"{location.name}.txt")
        if listing.is_file():
            return listing
        raise ConfigError(
            f"datamodule.source.splits.{split}={entry!r}: neither the folder {location} "
            f"(with {self.images}/ and {self.masks}/) nor the list {listing} exists; "
            f"expected one of them, or datamodule.source.splits.{split} set to the "
            "split's folder or .txt list under datamodule.source.root"
        )

    def _pair_listed(
        self, listing: Path, image_dir: Path, mask_dir: Path
    ) -> tuple[list[ImageMaskPair], list[FileProblem]]:
        problems: list[FileProblem] = []
        explained: set[str] = set()
        images = _files_by_key(image_dir, IMAGE_SUFFIXES, problems, explained)
        masks = _files_by_key(mask_dir, MASK_SUFFIXES, problems, explained)
        pairs = []
        for number, line in enumerate(listing.read_text().splitlines(), 1):
            name = line.split("#", 1)[0].strip()
            if not name:
                continue
            key = str(Path(name).with_suffix("")) if Path(name).suffix else name
            where = f"{listing}:{number}"
            if key in explained and (key not in images or key not in masks):
                continue  # its unusable image or mask is listed already
            if key not in images:
                problems.append(FileProblem(Path(where), f"no image {name!r} in {image_dir}"))
            elif key not in masks:
                problems.append(FileProblem(images[key], f"no mask for it in {mask_dir}"))
            else:
                pairs.append(ImageMaskPair(images[key], masks[key]))
        return pairs, problems


def _pair_folders(image_dir: Path, mask_dir: Path) -> tuple[list[ImageMaskPair], list[FileProblem]]:
    """Pair every image under ``image_dir`` with the mask of the same key."""
    problems = [
        FileProblem(folder, "folder does not exist")
        for folder in (image_dir, mask_dir)
        if not folder.is_dir()
    ]
    if problems:
        return [], problems
    explained: set[str] = set()
    images = _files_by_key(image_dir, IMAGE_SUFFIXES, problems, explained)
    masks = _files_by_key(mask_dir, MASK_SUFFIXES, problems, explained)
    pairs = [ImageMaskPair(images[k], masks[k]) for k in sorted(images) if k in masks]
    problems += [
        FileProblem(images[k], f"no mask for it in {mask_dir}")
        for k in sorted(images)
        if k not in masks and k not in explained
    ]
    problems += [
        FileProblem(masks[k], f"no image for it in {image_dir}")
        for k in sorted(masks)
        if k not in images and k not in explained
    ]
    return pairs, problems


def _files_by_key(
    folder: Path, suffixes: tuple[str, ...], problems: list[FileProblem], explained: set[str]
) -> dict[str, Path]:
    """Files under ``folder`` with one of ``suffixes``, by relative path without suffix.

    A second file with the same key (``a.png`` and ``a.tif``) is ambiguous: it is added
    to ``problems`` and left out. So is an entry named like an image that cannot be
    used (``_unusable``), with what it is; its key goes into ``explained``, so that its
    partner is not also reported as unpaired.
    """
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*")):
        if path.name.startswith(".") or path.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        key = str(path.relative_to(folder).with_suffix(""))
        reason = _unusable(path, suffixes)
        if reason:
            problems.append(FileProblem(path, reason))
            explained.add(key)
        elif key in found:
            problems.append(FileProblem(path, f"same name as {found[key].name}; keep one"))
        else:
            found[key] = path
    return found


def _unusable(path: Path, suffixes: tuple[str, ...]) -> str | None:
    """Why ``path``, named like an image, is no file of ``suffixes``; ``None`` if it is one."""
    if path.is_symlink() and not path.exists():
        return f"a link to {path.readlink()}, which does not exist"
    if path.is_dir():
        return "a folder, not an image file; rename or move it"
    if not path.is_file():
        return "not a regular file (a device, a pipe or a socket)"
    if path.suffix.lower() not in suffixes:  # an image format masks may not have
        return (
            f"a {path.suffix.lstrip('.').upper()} mask; masks must be "
            f"{'/'.join(s.lstrip('.').upper() for s in suffixes)} (lossy compression "
            "changes the label values)"
        )
    return None
