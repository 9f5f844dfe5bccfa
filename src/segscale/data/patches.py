"""Patch datasets: random patches for training, a fixed grid for validation."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from segscale.data.augment import Augmentation, PatchPose, cut_patch, patch_rng
from segscale.data.sources import Tile

PatchKey = tuple[int, int]
"""``(epoch, index)``: the address of one random patch."""


def _as_sample(
    image: np.ndarray, mask: np.ndarray, key: tuple[int, ...]
) -> dict[str, torch.Tensor]:
    # Images and masks stay in their file's types (uint8 masks, uint8/uint16 images) on
    # their way through the DataLoader: 4× (images) and 8× (masks) less to copy between
    # processes than float32 and int64. The LightningModule converts them on the device.
    return {
        "image": torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))),
        "mask": torch.from_numpy(np.ascontiguousarray(mask)),
        "key": torch.tensor(key, dtype=torch.long),
    }


class RandomPatchDataset(Dataset):
    """Random, augmented patches cut from large tiles, addressed by ``(epoch, index)``.

    Like MATLAB's ``randomPatchExtractionDatastore``: one epoch is
    ``patches_per_image × len(tiles)`` patches, and patch ``index`` comes from tile
    ``index % len(tiles)``. Everything about a patch (its window centre, rotation,
    translation and further transforms) is a pure function of ``(seed, epoch, index)``.
    Indices past ``len(self)`` are valid too: they address further fresh patches, which
    samplers use to pad an epoch so that every rank gets the same number of patches.
    An integer key means epoch 0.
    """

    def __init__(
        self,
        tiles: list[Tile],
        patch_size: int,
        patches_per_image: int,
        augmentation: Augmentation,
        seed: int = 0,
        ignore_index: int = 255,
    ) -> None:
        if not tiles:
            raise ValueError("RandomPatchDataset needs at least one tile")
        self.tiles, self.patch_size, self.patches_per_image = tiles, patch_size, patches_per_image
        self.augmentation, self.seed, self.ignore_index = augmentation, seed, ignore_index

    def __len__(self) -> int:
        return self.patches_per_image * len(self.tiles)

    def pose(self, epoch: int, index: int) -> PatchPose:
        """The window that patch ``(epoch, index)`` is cut with."""
        return self._draw(epoch, index)[1]

    def __getitem__(self, key: PatchKey | int) -> dict[str, torch.Tensor]:
        epoch, index = (0, key) if isinstance(key, int) else key
        rng, pose = self._draw(epoch, index)
        tile = self.tiles[index % len(self.tiles)]
        image, mask = cut_patch(tile.image, tile.mask, pose, self.patch_size, self.ignore_index)
        image, mask = self.augmentation.transform(image, mask, rng)
        return _as_sample(image, mask, (epoch, index))

    def _draw(self, epoch: int, index: int) -> tuple[np.random.Generator, PatchPose]:
        rng = patch_rng(self.seed, epoch, index)
        height, width = self.tiles[index % len(self.tiles)].shape
        half = self.patch_size / 2
        # The untransformed window lies inside the tile; rotation and translation may
        # then reach past the border, and those pixels become ignore_index.
        centre_x = rng.uniform(half, width - half)
        centre_y = rng.uniform(half, height - half)
        return rng, self.augmentation.pose(rng, centre_x, centre_y)


class GridPatchDataset(Dataset):
    """Every tile covered by a fixed grid of patches, each pixel counted exactly once.

    The grid steps by ``patch_size``; the last row and column are moved back to end at
    the tile border, and the pixels they share with their neighbour are set to
    ``ignore_index`` in the mask so that metrics count every pixel once. The same grid
    comes out every epoch, in the same order.
    """

    def __init__(self, tiles: list[Tile], patch_size: int, ignore_index: int = 255) -> None:
        self.tiles, self.patch_size, self.ignore_index = tiles, patch_size, ignore_index
        self.windows: list[tuple[int, int, int, int, int]] = []  # tile, y, x, skip_y, skip_x
        for t, tile in enumerate(tiles):
            height, width = tile.shape
            for y, skip_y in _grid(height, patch_size):
                for x, skip_x in _grid(width, patch_size):
                    self.windows.append((t, y, x, skip_y, skip_x))

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        t, y, x, skip_y, skip_x = self.windows[index]
        size, tile = self.patch_size, self.tiles[t]
        image = tile.image[y : y + size, x : x + size]
        mask = tile.mask[y : y + size, x : x + size].copy()
        mask[:skip_y, :] = self.ignore_index
        mask[:, :skip_x] = self.ignore_index
        return _as_sample(image, mask, (t, y, x))


def _grid(length: int, size: int) -> list[tuple[int, int]]:
    """Window starts along one axis, with how many leading pixels repeat the last window."""
    if size > length:
        raise ValueError(f"patch size {size} is larger than an image side of {length} pixels")
    starts = [(s, 0) for s in range(0, length - size + 1, size)]
    covered = starts[-1][0] + size
    if covered < length:
        starts.append((length - size, covered - (length - size)))
    return starts
