"""A dataset of the user's own files: per split, image and mask folders, a list file or a tree."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from segscale.data.datasets.lists import pair_listed
from segscale.data.datasets.name_pairing import Naming, file_identity, pair_folders, repeated_files
from segscale.data.datasets.split_forms import SPLIT_KEYS, check_splits, forms, is_folder_name
from segscale.data.datasets.trees import listed_pairs, shared_pairs, tree_pairs
from segscale.data.storage.sources import IMAGE_SUFFIXES, MASK_SUFFIXES, FileProblem, ImageMaskPair
from segscale.errors import ConfigError, require


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
      the folders that its one-name lines are looked up in);
    - ``{tree: <folder>}``: every ``images`` folder with a ``masks`` folder beside it, at
      any depth under ``root/<folder>`` (``.``: the root), each pair keyed by its path
      without that folder (``Tile 3/image_part_004``, ``segscale.data.datasets.trees``);
      ``images``/``masks`` rename the folders looked for, and one of ``list: <file>``
      (keys or folders of the tree, one a line), ``share: <0 to 1>`` and ``except:
      <split>`` (the pairs that split does not have) takes a part of them
      (``segscale.data.datasets.trees``).

    A list holds per line an image name, looked up under the ``images`` folder (``root/
    images`` unless the split says otherwise) and paired with the ``masks`` folder by
    name, or an image path and its mask path (``segscale.data.datasets.lists``); blank lines
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
        entry = self.splits.get(split)
        if isinstance(entry, Mapping) and "tree" in entry:
            return self._tree_split(split, entry)
        files = self.split_files(split)
        if files.listing is not None:
            return pair_listed(
                files.listing,
                Path(self.root),
                files.images,
                files.masks,
                self._naming("image"),
                self._naming("mask"),
            )
        pairs, problems = pair_folders(
            files.images, files.masks, self._naming("image"), self._naming("mask")
        )
        return pairs, problems + repeated_files(pairs, [str(p.image) for p in pairs])

    def split_files(self, split: str) -> SplitFiles:
        """Where ``split``'s files are (a split not given as a tree).

        Raises ``ConfigError`` naming the keys if they are not there.
        """
        entry = self.splits.get(split)
        if not entry:
            raise ConfigError(
                f"datamodule.source.splits.{split} is not set; expected {forms(split)}"
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
                f"{forms(split, self._mask_folder_beside(location))}"
            )
        if location.suffix:
            raise ConfigError(f"{key}: {location} does not exist; expected {forms(split)}")
        raise ConfigError(
            f"{key}: neither the folder {location} (with {self.images}/ and {self.masks}/) "
            f"nor the list {listing} exists; expected {forms(split)}"
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
                    f"under datamodule.source.root={self.root!r}, or {forms(split)}"
                )
            return SplitFiles(images, masks, listing)
        for name, folder in (("images", images), ("masks", masks)):
            if not folder.is_dir():
                raise ConfigError(
                    f"{key}.{name}={entry[name]!r}: {folder} is not a folder; expected "
                    f"{SPLIT_KEYS[name]} under datamodule.source.root={self.root!r}, or "
                    f"{forms(split)}"
                )
        return SplitFiles(images, masks)

    def _tree_split(
        self, split: str, entry: Mapping[str, Any]
    ) -> tuple[list[ImageMaskPair], list[FileProblem]]:
        """The pairs of a tree (``{tree: ...}``), all or the part that the split chooses."""
        key = f"datamodule.source.splits.{split}"
        top = Path(self.root) / entry["tree"]
        images, masks = self._tree_folders(key, entry)
        if not top.is_dir():
            raise ConfigError(
                f"{key}.tree={entry['tree']!r}: {top} is not a folder; expected the folder "
                f"under datamodule.source.root={self.root!r} whose {images}/ and {masks}/ "
                "folders hold the split ('.': the root itself)"
            )
        found, problems, folders = tree_pairs(
            top, images, masks, self._naming("image"), self._naming("mask")
        )
        if not folders and not problems:
            raise ConfigError(
                f"{key}.tree={entry['tree']!r}: no {images}/ folder with a {masks}/ folder "
                f"beside it under {top} (at any depth); expected {forms(split)}"
            )
        chosen, places = found, [str(found_pair.pair.image) for found_pair in found]
        if "list" in entry:
            listing = Path(self.root) / entry["list"]
            if not listing.is_file():
                raise ConfigError(
                    f"{key}.list={entry['list']!r}: {listing} is not a file; expected a list "
                    f"of the tree's keys or folders under datamodule.source.root={self.root!r}"
                )
            chosen, places, unknown = listed_pairs(found, listing, top)
            problems += unknown
        elif "share" in entry:
            chosen = shared_pairs(found, float(entry["share"]))
            places = [str(found_pair.pair.image) for found_pair in chosen]
        elif "except" in entry:
            others = {file_identity(pair.image) for pair in self.pairs(str(entry["except"]))}
            kept = [
                i
                for i, found_pair in enumerate(found)
                if file_identity(found_pair.pair.image) not in others
            ]
            chosen, places = [found[i] for i in kept], [places[i] for i in kept]
        pairs = [found_pair.pair for found_pair in chosen]
        return pairs, problems + repeated_files(pairs, places)

    def _tree_folders(self, key: str, entry: Mapping[str, Any]) -> tuple[str, str]:
        """The names of a tree's image and mask folders: the split's, or the source's."""
        names = []
        for what in ("images", "masks"):
            name = str(entry.get(what, getattr(self, what)))
            if not is_folder_name(name):
                raise ConfigError(
                    f"datamodule.source.{what}={name!r}: a tree ({key}.tree) pairs the "
                    f"folders of one name at any depth; expected a folder name, or give "
                    f"{key}.{what}=<name>"
                )
            names.append(name)
        return names[0], names[1]

    def _mask_folder_beside(self, location: Path) -> str:
        """A sibling of ``location`` that may hold its masks (``trainannot``), for messages."""
        siblings = sorted(
            p.name
            for p in location.parent.iterdir()
            if p.is_dir() and p.name != location.name and p.name.startswith(location.name)
        )
        return siblings[0] if siblings else "<mask folder>"


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _plain(value: Any) -> Any:
    """``value`` with every mapping a plain dict, so that it can be written as JSON.

    A split given as ``{images: …, masks: …}`` arrives as a config node.
    """
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
