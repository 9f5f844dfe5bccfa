"""A dataset of the user's own files: per split, image and mask folders or a list file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from segscale.data.list_files import (
    ListedLine,
    read_list,
    resolve_listed,
    windows_form,
    windows_hint,
    windows_parts,
)
from segscale.data.name_pairing import Naming, files_by_key, pair_folders, unusable
from segscale.data.repeated_files import repeated_files
from segscale.data.sources import IMAGE_SUFFIXES, MASK_SUFFIXES, FileProblem, ImageMaskPair
from segscale.errors import ConfigError, require

SPLIT_KEYS = {
    "images": "the split's image folder",
    "masks": "the split's mask folder",
    "list": "the split's list file",
}
"""The keys of a split given as a mapping, and what each names (under the root)."""

LIST_BASES = "the list's folder or datamodule.source.root"
"""What the paths of a list start from, in words (messages)."""


@dataclass(frozen=True)
class SplitFiles:
    """Where one split's files are: image and mask folders, and the list file if any."""

    images: Path
    masks: Path
    listing: Path | None = None


@dataclass(frozen=True)
class FolderTiles:
    """Images and masks of each split, paired by name or listed in pairs.

    Each entry of ``splits`` (``train``, ``val``, ``test``) is one of

    - a name under ``root``: the folder ``root/<name>`` with its own ``images``/``masks``
      subfolders (``train/images/a.png`` ↔ ``train/masks/a.png``), else the list file
      ``root/<name>`` (or ``root/<name>.txt`` for a name without extension);
    - ``{images: <folder>, masks: <folder>}``: two folders under ``root``, named freely
      (CamVid's ``train`` and ``trainannot``; Cityscapes' ``leftImg8bit/train`` and
      ``gtFine/train``);
    - ``{list: <file>}``: a list file under ``root`` (``images``/``masks`` may be added:
      the folders that its one-name lines are looked up in).

    A list holds per line an image name, looked up under the ``images`` folder (``root/
    images`` unless the split says otherwise) and paired with the ``masks`` folder by
    name, or an image path and its mask path (``segscale.data.list_files``); blank lines
    and ``#`` comments are skipped. A split is looked for only when it is read (training
    reads ``train`` and ``val``; ``evaluate.py split=test`` reads ``test``).

    Folders are searched with their subfolders, and images pair with the mask of the
    same key (``Naming``): the path below the folder without extension and without
    ``image_suffix``/``mask_suffix`` (Cityscapes: ``_leftImg8bit`` and
    ``_gtFine_labelIds``). Images: PNG, JPEG, TIFF; masks: PNG, TIFF.
    """

    root: str
    images: str = "images"
    masks: str = "masks"
    splits: Mapping[str, str | Mapping[str, str] | None] = field(
        default_factory=lambda: {"train": "train", "val": "val", "test": "test"}
    )
    image_suffix: str = ""
    mask_suffix: str = ""

    def __post_init__(self) -> None:
        """Refuse a split or a name suffix of the wrong form (``ConfigError``)."""
        check_splits(self.splits)
        for name in ("image_suffix", "mask_suffix"):
            expected = "a string that file names end with (before or with the extension)"
            require(getattr(self, name), f"datamodule.source.{name}", _is_str, expected)

    @property
    def cache_key(self) -> str:
        """The resolved root, subfolder names and splits: the validation cache's key."""
        settings = {
            "root": str(Path(self.root).resolve()),
            "images": self.images,
            "masks": self.masks,
            "splits": {name: _plain(split) for name, split in self.splits.items()},
            "image_suffix": self.image_suffix,
            "mask_suffix": self.mask_suffix,
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
        """Whether ``split`` is configured (``scan`` finds its files, or says why not)."""
        return bool(self.splits.get(split))

    def pairs(self, split: str) -> list[ImageMaskPair]:
        """The complete image/mask pairs of ``split``, in name (or list) order."""
        return self.scan(split)[0]

    def problems(self, split: str) -> list[FileProblem]:
        """Files of ``split`` that cannot be paired: an image without mask, and so on."""
        return self.scan(split)[1]

    def scan(self, split: str) -> tuple[list[ImageMaskPair], list[FileProblem]]:
        """Pair the files of ``split``; return the pairs and the files left unpaired."""
        files = self.split_files(split)
        if files.listing is not None:
            return self._pair_listed(files, files.listing)
        pairs, problems = pair_folders(
            files.images, files.masks, self._naming("image"), self._naming("mask")
        )
        return pairs, problems + repeated_files(pairs, [str(p.image) for p in pairs])

    def split_files(self, split: str) -> SplitFiles:
        """Where ``split``'s files are; ``ConfigError`` naming the keys if they are not there."""
        entry = self.splits.get(split)
        if not entry:
            raise ConfigError(
                f"datamodule.source.splits.{split} is not set; expected {_forms(split)}"
            )
        if isinstance(entry, str):
            return self._named_split(split, entry)
        return self._mapped_split(split, entry)

    def _naming(self, what: str) -> Naming:
        if what == "image":
            return Naming("image", IMAGE_SUFFIXES, self.image_suffix, "image_suffix")
        return Naming("mask", MASK_SUFFIXES, self.mask_suffix, "mask_suffix")

    def _named_split(self, split: str, entry: str) -> SplitFiles:
        """``splits[split]`` given as a name: a folder with images/ and masks/, or a list."""
        root = Path(self.root)
        location = root / entry
        if location.is_file():
            return SplitFiles(root / self.images, root / self.masks, location)
        if (location / self.images).is_dir() and (location / self.masks).is_dir():
            return SplitFiles(location / self.images, location / self.masks)
        listing = location.with_name(f"{location.name}.txt")
        if not location.suffix and listing.is_file():
            return SplitFiles(root / self.images, root / self.masks, listing)
        key = f"datamodule.source.splits.{split}={entry!r}"
        if location.is_dir():
            missing = [f"{n}/" for n in (self.images, self.masks) if not (location / n).is_dir()]
            raise ConfigError(
                f"{key}: the folder {location} has no {' and no '.join(missing)} subfolder "
                f"(datamodule.source.images={self.images!r}, datamodule.source.masks="
                f"{self.masks!r}) and there is no list {listing}; expected "
                f"{_forms(split, self._mask_folder_beside(location))}"
            )
        if location.suffix:
            raise ConfigError(f"{key}: {location} does not exist; expected {_forms(split)}")
        raise ConfigError(
            f"{key}: neither the folder {location} (with {self.images}/ and {self.masks}/) "
            f"nor the list {listing} exists; expected {_forms(split)}"
        )

    def _mapped_split(self, split: str, entry: Mapping[str, str]) -> SplitFiles:
        """``splits[split]`` given as ``{images, masks}`` or ``{list}``, under the root."""
        root = Path(self.root)
        key = f"datamodule.source.splits.{split}"
        images = root / entry.get("images", self.images)
        masks = root / entry.get("masks", self.masks)
        if "list" in entry:
            listing = root / entry["list"]
            if not listing.is_file():
                raise ConfigError(
                    f"{key}.list={entry['list']!r}: {listing} is not a file; expected a list "
                    f"under datamodule.source.root={self.root!r}, or {_forms(split)}"
                )
            return SplitFiles(images, masks, listing)
        for name, folder in (("images", images), ("masks", masks)):
            if not folder.is_dir():
                raise ConfigError(
                    f"{key}.{name}={entry[name]!r}: {folder} is not a folder; expected "
                    f"{SPLIT_KEYS[name]} under datamodule.source.root={self.root!r}, or "
                    f"{_forms(split)}"
                )
        return SplitFiles(images, masks)

    def _mask_folder_beside(self, location: Path) -> str:
        """A sibling of ``location`` that may hold its masks (``trainannot``), for messages."""
        siblings = sorted(
            p.name
            for p in location.parent.iterdir()
            if p.is_dir() and p.name != location.name and p.name.startswith(location.name)
        )
        return siblings[0] if siblings else "<mask folder>"

    def _pair_listed(
        self, files: SplitFiles, listing: Path
    ) -> tuple[list[ImageMaskPair], list[FileProblem]]:
        """Pair the lines of ``listing``: a name each, or an image and a mask path."""
        bases = tuple(dict.fromkeys((listing.parent, Path(self.root))))
        named = _NamedFiles(files, self._naming("image"), self._naming("mask"))
        pairs: list[ImageMaskPair] = []
        places: list[str] = []
        problems: list[FileProblem] = []
        for line in read_list(listing):
            found: ImageMaskPair | FileProblem | None
            if len(line.fields) == 2:
                found = _listed_pair(line, bases, listing.name)
            elif len(line.fields) == 1:
                found = named.pair(line, listing.name)
            else:
                found = FileProblem(
                    Path(line.where),
                    f"{len(line.fields)} fields; expected an image name, or an image path "
                    "and its mask path (paths without spaces)",
                    kind=f"lines of {listing.name} that are neither",
                )
            if isinstance(found, ImageMaskPair):
                pairs.append(found)
                places.append(line.where)
            elif found is not None:
                problems.append(found)
        return pairs, named.problems + problems + repeated_files(pairs, places)


def check_splits(splits: object) -> None:
    """Raise ``ConfigError`` for a ``datamodule.source.splits`` value of the wrong form.

    Each split is a name (``str``), ``null``, or a mapping of ``SPLIT_KEYS`` to names:
    ``images`` and ``masks``, or ``list`` (with or without them).
    """
    if not isinstance(splits, Mapping):
        raise ConfigError(
            f"datamodule.source.splits={_shown(splits)!r} is not allowed: expected a mapping "
            "from split (train, val, test) to its files, e.g. {train: train, val: val}"
        )
    for name, entry in splits.items():
        split = str(name)
        key = f"datamodule.source.splits.{split}"
        if entry is None or isinstance(entry, str):
            continue
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{key}={_shown(entry)!r} is not allowed: expected {_forms(split)}")
        unknown = [str(k) for k in entry if k not in SPLIT_KEYS]
        if unknown or ("list" not in entry and not {"images", "masks"} <= set(entry)):
            what = f"unknown key {unknown[0]!r}" if unknown else "it needs images and masks"
            raise ConfigError(
                f"{key}={_shown(entry)!r} is not allowed ({what}): expected {_forms(split)}"
            )
        for item, value in entry.items():
            if not isinstance(value, str):
                raise ConfigError(
                    f"{key}.{item}={_shown(value)!r} is not allowed: expected "
                    f"{SPLIT_KEYS[str(item)]}, a path under datamodule.source.root"
                )


def _forms(split: str, masks: str = "<mask folder>") -> str:
    """The forms a split may take, for messages (``masks``: the example's mask folder)."""
    key = f"datamodule.source.splits.{split}"
    return (
        f"one of: {key}={split} (a folder under datamodule.source.root with images/ and "
        f"masks/, or else the list {split}.txt); {key}={{images:{split},masks:{masks}}} "
        f"(an image folder and a mask folder under the root); {key}={{list:{split}.txt}} "
        "(a list file under the root: an image name, or an image and a mask path, per line)"
    )


def _shown(value: object) -> object:
    """``value`` as plain Python, for messages (a config node shows as a dict or list)."""
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _is_str(value: object) -> bool:
    return isinstance(value, str)


class _NamedFiles:
    """The files of a list's one-name lines: its image and mask folders, read when needed."""

    def __init__(self, files: SplitFiles, image_naming: Naming, mask_naming: Naming) -> None:
        self.files = files
        self.image_naming = image_naming
        self.mask_naming = mask_naming
        self.problems: list[FileProblem] = []
        self.explained: set[str] = set()
        self._by_key: tuple[dict[str, Path], dict[str, Path]] | None = None

    def pair(self, line: ListedLine, list_name: str) -> ImageMaskPair | FileProblem | None:
        """The pair that ``line`` names, its problem, or ``None`` if reported already."""
        if self._by_key is None:
            self._by_key = (
                files_by_key(self.files.images, self.image_naming, self.problems, self.explained),
                files_by_key(self.files.masks, self.mask_naming, self.problems, self.explained),
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
            where = self.files.images
            kind = f"names in {list_name} with no image in {where}"
            hint = f"; {windows_hint(f'the image folder {where}')}" if windows_form(name) else ""
            return FileProblem(Path(line.where), f"no image {name!r} in {where}{hint}", kind)
        if key not in masks:
            where = self.files.masks
            kind = f"images listed in {list_name} without a mask in {where}"
            return FileProblem(images[key], f"no mask for it in {where}", kind)
        return ImageMaskPair(images[key], masks[key])

    def _key(self, name: str) -> str:
        """The pairing key of a listed name (one without the name suffix: as it is)."""
        key = self.image_naming.key(Path(name))
        return key or replace(self.image_naming, name_suffix="").key(Path(name)) or name


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
            return FileProblem(
                Path(line.where), reason, f"lines of {list_name} whose {what} is missing"
            )
        why = unusable(path, formats)
        if why:
            return FileProblem(path, f"{why} (listed at {line.where})")
        found.append(path)
    return ImageMaskPair(found[0], found[1])


def _plain(value: Any) -> Any:
    """``value`` with every mapping a plain dict, so that it can be written as JSON.

    A split given as ``{images: …, masks: …}`` arrives as a config node.
    """
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
