"""Joint image+mask augmentation, and the seeding that makes it index-addressed.

Every random choice for patch ``i`` of epoch ``e`` comes from ``patch_rng(seed, e, i)``,
so a patch does not depend on which rank or DataLoader worker draws it, nor on what was
drawn before it (docs/architecture.md, "Randomness addressed by index").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import albumentations as A
import cv2
import numpy as np

from segscale.data.storage.rasters import Pixels
from segscale.errors import ConfigError


def patch_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The random generator that owns every choice made for one patch."""
    return np.random.default_rng([seed, epoch, index])


@dataclass(frozen=True)
class PatchPose:
    """Where a patch is cut from its tile: centre in pixels, rotation in degrees, scale.

    ``scale`` resizes the tile before the cut (mmseg's ``RandomResize`` ratio): the patch
    covers ``patch_size / scale`` tile pixels a side, so its size stays the same.
    """

    centre_x: float
    centre_y: float
    angle: float
    scale: float = 1.0


class Augmentation:
    """Rotation, translation and scale of the sampling window, then optional albumentations.

    Rotation and translation move the window that cuts the patch out of the large tile
    (MATLAB's ``imageDataAugmenter`` ``RandRotation``/``RandXTranslation``/
    ``RandYTranslation``), so the patch is filled from the surrounding image, not with
    empty corners. ``scale`` (a range of resize factors, default ``[1, 1]``: off) grows
    or shrinks the window the same way (mmseg's random resize, ``ratio_range``), so the
    patch keeps its size; it is drawn after the others, only when it is not ``[1, 1]``,
    so the default draws the patches it drew before it existed. ``transforms`` are
    further albumentations transforms (flips, colour jitter, ...) applied jointly to the
    patch and its mask; they are reseeded for every patch, which is what keeps
    DataLoader workers from repeating each other.
    """

    def __init__(
        self,
        rotation: Sequence[float] = (-20.0, 20.0),
        translate_x: Sequence[float] = (-10.0, 10.0),
        translate_y: Sequence[float] = (-10.0, 10.0),
        transforms: Sequence[A.BasicTransform] = (),
        scale: Sequence[float] = (1.0, 1.0),
    ) -> None:
        self.rotation = _range("rotation", rotation)
        self.translate_x = _range("translate_x", translate_x)
        self.translate_y = _range("translate_y", translate_y)
        self.scale = _range("scale", scale)
        if self.scale[0] <= 0:
            raise ConfigError(
                f"datamodule.augmentation.scale={list(scale)} is not allowed: expected "
                "[low, high] resize factors above 0, e.g. [0.5, 2.0]"
            )
        self.pipeline = A.Compose(list(transforms)) if transforms else None

    def pose(self, rng: np.random.Generator, centre_x: float, centre_y: float) -> PatchPose:
        """Draw translation, rotation and scale around an untransformed window centre."""
        centre_x += rng.uniform(*self.translate_x)
        centre_y += rng.uniform(*self.translate_y)
        angle = rng.uniform(*self.rotation)
        scale = 1.0 if self.scale == (1.0, 1.0) else rng.uniform(*self.scale)
        return PatchPose(centre_x, centre_y, angle, scale)

    def transform(
        self, image: np.ndarray, mask: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Apply the albumentations transforms, seeded from ``rng``."""
        if self.pipeline is None:
            return image, mask
        self.pipeline.set_random_seed(int(rng.integers(2**31)))
        out = self.pipeline(image=image, mask=mask)
        return out["image"], out["mask"]


def cut_patch(
    image: Pixels, mask: Pixels, pose: PatchPose, size: int, ignore_index: int
) -> tuple[np.ndarray, np.ndarray]:
    """Cut a ``size``×``size`` patch at ``pose`` out of a tile in one affine warp.

    The image is sampled bilinearly and the mask with nearest neighbour. Pixels whose
    source lies outside the tile are ``ignore_index`` in the mask; the image mirrors the
    tile there, so that border pixels are not blended with black.
    """
    # Map patch pixel (u, v) to tile pixel: rotate and resize about the patch centre,
    # then move the patch centre onto the pose's centre.
    theta = np.deg2rad(pose.angle)
    cos, sin = np.cos(theta) / pose.scale, np.sin(theta) / pose.scale
    half = (size - 1) / 2
    matrix = np.array(
        [
            [cos, -sin, pose.centre_x - 0.5 - (cos * half - sin * half)],
            [sin, cos, pose.centre_y - 0.5 - (sin * half + cos * half)],
        ],
        dtype=np.float64,
    )
    # Warp from the window of the tile that the patch reaches, not the whole tile: a
    # memory-mapped tile then reads only those pages, and a channel-first one is made
    # contiguous for OpenCV at the cost of a patch, not a tile.
    (y0, y1), (x0, x1) = _source_window(matrix, size, mask.shape)
    matrix[:, 2] -= (x0, y0)
    image = np.ascontiguousarray(image[y0:y1, x0:x1])
    mask = np.ascontiguousarray(mask[y0:y1, x0:x1])
    flags = cv2.WARP_INVERSE_MAP
    patch = cv2.warpAffine(
        image,
        matrix,
        (size, size),
        flags=flags | cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REFLECT_101,
    )
    labels = cv2.warpAffine(
        mask,
        matrix,
        (size, size),
        flags=flags | cv2.INTER_NEAREST,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=ignore_index,
    )
    if patch.ndim == 2:  # cv2 drops a trailing channel axis of size 1
        patch = patch[:, :, None]
    return patch, labels


def _source_window(
    matrix: np.ndarray, size: int, shape: tuple[int, ...]
) -> tuple[tuple[int, int], tuple[int, int]]:
    """Rows and columns of the tile that a patch warped with ``matrix`` samples from.

    Two pixels of margin cover bilinear neighbours; the window is clipped to the tile,
    so that the warp's border handling still happens at the tile's own border.
    """
    corners = np.array([[0, 0, 1], [size - 1, 0, 1], [0, size - 1, 1], [size - 1, size - 1, 1]])
    xs, ys = (corners @ matrix.T).T
    height, width = shape[:2]
    rows = max(0, int(np.floor(ys.min())) - 2), min(height, int(np.ceil(ys.max())) + 3)
    cols = max(0, int(np.floor(xs.min())) - 2), min(width, int(np.ceil(xs.max())) + 3)
    return rows, cols


def _range(name: str, value: Sequence[float]) -> tuple[float, float]:
    low, high = (float(v) for v in value)
    if low > high:
        raise ConfigError(
            f"datamodule.augmentation.{name}={list(value)} is not allowed: expected [low, high]"
        )
    return low, high
