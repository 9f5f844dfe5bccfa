"""The embedded default dataset: deterministic, aerial-like tiles with six classes.

Each tile is drawn from ``numpy.random.default_rng([seed, tile_index])``, so the same
settings always give the same pixels. Classes share colours on purpose (grey roofs and
grey roads, green trees and green lawns, cars of any colour), so a network has to learn
texture and shape, not a colour lookup. The tiles are written once as PNG files into a
folder named after the generator's settings and reused by every later run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from segscale.atomic_files import write_text_atomically
from segscale.data.storage.sources import FileProblem, ImageMaskPair, write_image, write_mask

CLASS_NAMES = ("impervious_surface", "building", "low_vegetation", "tree", "car", "clutter")
IMPERVIOUS, BUILDING, LOW_VEGETATION, TREE, CAR, CLUTTER = range(6)
_FORMAT_VERSION = 1  # bump when the drawing changes, so cached tiles are regenerated


@dataclass(frozen=True)
class SyntheticTiles:
    """A generated train/validation set of aerial-like tiles stored under ``root``.

    ``prepare()`` draws the tiles if they are not on disk yet; ``pairs(split)`` lists
    the image/mask files of ``"train"`` or ``"val"``.
    """

    root: str = "data/synthetic"
    num_train: int = 5
    num_val: int = 2
    image_size: int = 1024
    seed: int = 0

    @property
    def folder(self) -> Path:
        """Folder holding this generator's tiles; its name encodes the settings."""
        counts = f"n{self.num_train}+{self.num_val}"
        name = f"v{_FORMAT_VERSION}_{counts}_s{self.image_size}_seed{self.seed}"
        return Path(self.root) / name

    @property
    def cache_key(self) -> str:
        """The resolved folder of the tiles (its name holds the settings): the cache's key."""
        return str(self.folder.resolve())

    def has_split(self, split: str) -> bool:
        """Whether ``split`` exists: ``train`` and ``val`` do."""
        return split in ("train", "val")

    def prepare(self) -> None:
        """Draw and write the tiles unless a complete set is already on disk."""
        if (self.folder / "meta.json").is_file():
            return
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        # Draw into a private folder and rename it into place, so a concurrent
        # process (another rank) or a crash never leaves a half-written set behind.
        staging = Path(tempfile.mkdtemp(dir=self.folder.parent, prefix=".staging-"))
        try:
            self._write_all(staging)
            os.rename(staging, self.folder)
        except OSError:
            if not (self.folder / "meta.json").is_file():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def pairs(self, split: str) -> list[ImageMaskPair]:
        """Image/mask file pairs of ``split`` (``"train"`` or ``"val"``)."""
        if not self.has_split(split):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        count = self.num_train if split == "train" else self.num_val
        return [
            ImageMaskPair(
                self.folder / split / "images" / f"{i:04d}.png",
                self.folder / split / "masks" / f"{i:04d}.png",
            )
            for i in range(count)
        ]

    def scan(self, split: str) -> tuple[list[ImageMaskPair], list[FileProblem]]:
        """The pairs of ``split``; generated files always pair, so no problems."""
        return self.pairs(split), []

    def _write_all(self, folder: Path) -> None:
        for split, offset, count in (("train", 0, self.num_train), ("val", 10_000, self.num_val)):
            (folder / split / "images").mkdir(parents=True)
            (folder / split / "masks").mkdir(parents=True)
            for i in range(count):
                image, mask = draw_tile(self.image_size, seed=self.seed, index=offset + i)
                write_image(folder / split / "images" / f"{i:04d}.png", image)
                write_mask(folder / split / "masks" / f"{i:04d}.png", mask)
        meta = {"format_version": _FORMAT_VERSION, "class_names": list(CLASS_NAMES)}
        meta |= {k: v for k, v in asdict(self).items() if k != "root"}
        write_text_atomically(folder / "meta.json", json.dumps(meta, indent=2))


def draw_tile(size: int, seed: int, index: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw one tile: an ``(size, size, 3)`` uint8 image and its ``(size, size)`` mask."""
    rng = np.random.default_rng([seed, index])
    mask = np.full((size, size), LOW_VEGETATION, np.uint8)
    canvas = _Canvas(size, rng)
    canvas.ground()
    _draw_roads(mask, canvas, rng)
    _draw_buildings(mask, canvas, rng)
    _draw_trees(mask, canvas, rng)
    _draw_cars(mask, canvas, rng)
    _draw_clutter(mask, canvas, rng)
    return canvas.finish(mask), mask


class _Canvas:
    """Per-class colour layers that are composited through the mask at the end."""

    def __init__(self, size: int, rng: np.random.Generator) -> None:
        self.size = size
        self.rng = rng
        self.layers = {c: np.zeros((size, size, 3), np.float32) for c in range(len(CLASS_NAMES))}
        self.shadow = np.zeros((size, size), np.float32)

    def noise(self, sigma: float, amplitude: float, channels: int = 1) -> np.ndarray:
        """Gaussian noise smoothed at scale ``sigma`` and rescaled to ``amplitude``."""
        n = self.rng.standard_normal((self.size, self.size, channels)).astype(np.float32)
        if sigma > 0:
            blurred: np.ndarray = cv2.GaussianBlur(n, (0, 0), sigma)  # float32, as n
            n = blurred.reshape(self.size, self.size, channels)
            n /= n.std() + 1e-6
        return n * amplitude

    def ground(self) -> None:
        """Fill the texture layers of the classes that cover areas."""
        jitter = self.rng.uniform(-15, 15, 3)
        lawn = np.array([115, 140, 75]) + jitter
        self.layers[LOW_VEGETATION][:] = (
            lawn + self.noise(24, 14) + self.noise(6, 6, 3) + self.noise(0, 2)
        )
        # Trees share the lawn's hue but are leafy: strong, fine-grained blobs.
        tree = lawn * self.rng.uniform(0.55, 0.75) + self.rng.uniform(-8, 8, 3)
        self.layers[TREE][:] = tree + self.noise(1.6, 26) + self.noise(5, 10)
        asphalt = self.rng.uniform(95, 150)
        self.layers[IMPERVIOUS][:] = asphalt + self.noise(0, 6) + self.noise(30, 8)
        self.layers[CLUTTER][:] = (
            np.array([130, 115, 95]) + self.rng.uniform(-25, 25, 3) + self.noise(2.5, 22, 3)
        )

    def finish(self, mask: np.ndarray) -> np.ndarray:
        """Composite the layers through ``mask``, add shadows and sensor noise."""
        stack = np.stack([self.layers[c] for c in range(len(CLASS_NAMES))])
        image = np.take_along_axis(stack, mask[None, :, :, None].astype(np.intp), axis=0)[0]
        shade = 1.0 - 0.45 * cv2.GaussianBlur(self.shadow, (0, 0), 1.5)[..., None]
        image = image * shade + self.noise(0, 3)
        image = cv2.GaussianBlur(image, (0, 0), 0.6)
        return np.clip(image, 0, 255).astype(np.uint8)


def _rotated_rect(cx: float, cy: float, w: float, h: float, angle: float) -> np.ndarray:
    """Corner points (int32, 4×2) of a ``w``×``h`` rectangle centred at (cx, cy)."""
    return cv2.boxPoints(((cx, cy), (w, h), angle)).round().astype(np.int32)


def _roof_half(cx: float, cy: float, w: float, h: float, angle: float) -> np.ndarray:
    """Corner points of one half of a roof, split along its long side."""
    theta = np.deg2rad(angle)
    if w >= h:  # the ridge runs along w; step across it, along the h axis
        dx, dy, half = -np.sin(theta) * h / 4, np.cos(theta) * h / 4, (w, h / 2)
    else:
        dx, dy, half = np.cos(theta) * w / 4, np.sin(theta) * w / 4, (w / 2, h)
    return _rotated_rect(cx + dx, cy + dy, *half, angle)


def _draw_roads(mask: np.ndarray, canvas: _Canvas, rng: np.random.Generator) -> None:
    size = mask.shape[0]
    markings = np.zeros_like(mask)
    margin = size // 12
    for axis in (0, 1):
        count = min(int(rng.integers(3, 5)), size - 2 * margin)
        for pos in rng.choice(np.arange(margin, size - margin), count, replace=False):
            width = int(rng.integers(18, 30))
            drift = int(rng.integers(-60, 60))
            p0, p1 = (pos, 0), (pos + drift, size - 1)
            if axis:
                p0, p1 = p0[::-1], p1[::-1]
            cv2.line(mask, p0, p1, IMPERVIOUS, width)
            cv2.line(markings, p0, p1, 1, 2)
    # Dashed centre lines: bright paint that still belongs to the road class.
    dashes = (np.indices(mask.shape).sum(0) // 12) % 2 == 0
    canvas.layers[IMPERVIOUS][(markings > 0) & dashes] += 90
    for _ in range(rng.integers(3, 6)):  # parking lots and squares
        cx, cy = rng.uniform(0, size, 2)
        w, h = rng.uniform(40, 110, 2)
        pts = _rotated_rect(cx, cy, w, h, rng.uniform(0, 90))
        cv2.fillPoly(mask, [pts], IMPERVIOUS)


def _draw_buildings(mask: np.ndarray, canvas: _Canvas, rng: np.random.Generator) -> None:
    size = mask.shape[0]
    roofs = np.array([[125, 125, 130], [160, 85, 65], [80, 80, 88], [185, 175, 160]], np.float32)
    placed = 0
    for _ in range(1500):
        if placed >= 60:
            break
        w, h = rng.uniform(28, 90, 2)
        cx, cy = rng.uniform(0, size, 2)
        angle = float(rng.choice([0.0, 90.0, rng.uniform(-30, 30)]))
        pts = _rotated_rect(cx, cy, w, h, angle)
        footprint = np.zeros_like(mask)
        cv2.fillPoly(footprint, [pts], 1)
        inside = footprint > 0
        if (mask[inside] != LOW_VEGETATION).mean() > 0.02:
            continue  # keep buildings off roads and off each other
        placed += 1
        roof = roofs[rng.integers(len(roofs))] + rng.uniform(-15, 15, 3)
        # A gable roof: the two halves either side of the ridge catch the light differently.
        ridge = np.zeros_like(mask)
        cv2.fillPoly(ridge, [_roof_half(cx, cy, w, h, angle)], 1)
        layer = canvas.layers[BUILDING]
        layer[inside] = roof
        layer[inside & (ridge > 0)] *= rng.uniform(0.75, 0.9)
        cv2.polylines(layer, [pts], True, (roof * 0.6).tolist(), 2)
        shadow = np.zeros_like(mask)
        cv2.fillPoly(shadow, [pts + np.array([9, 7], np.int32)], 1)
        canvas.shadow[(shadow > 0) & ~inside] = 1.0
        mask[inside] = BUILDING
    layer = canvas.layers[BUILDING]
    layer += canvas.noise(0, 4)


def _draw_trees(mask: np.ndarray, canvas: _Canvas, rng: np.random.Generator) -> None:
    size = mask.shape[0]
    crowns = np.zeros_like(mask)
    for _ in range(rng.integers(24, 36)):  # groves of overlapping crowns
        gx, gy = rng.uniform(0, size, 2)
        for _ in range(rng.integers(3, 14)):
            x, y = rng.normal([gx, gy], 30)
            r = int(rng.integers(7, 20))
            cv2.circle(crowns, (int(x), int(y)), r, 1, -1)
            cv2.circle(canvas.shadow, (int(x) + r // 2, int(y) + r // 2), r, 0.8, -1)
    grows = (crowns > 0) & np.isin(mask, (LOW_VEGETATION, IMPERVIOUS))
    mask[grows] = TREE


def _draw_cars(mask: np.ndarray, canvas: _Canvas, rng: np.random.Generator) -> None:
    size = mask.shape[0]
    road = mask == IMPERVIOUS
    placed = 0
    for _ in range(2000):
        if placed >= 90:
            break
        cx, cy = rng.uniform(10, size - 10, 2)
        if not road[int(cy), int(cx)]:
            continue
        angle = float(rng.choice([0.0, 90.0]) + rng.normal(0, 4))
        pts = _rotated_rect(cx, cy, 16, 8, angle)
        body = np.zeros_like(mask)
        cv2.fillPoly(body, [pts], 1)
        inside = body > 0
        if not road[inside].all():
            continue
        placed += 1
        paint = rng.choice([rng.uniform(20, 235, 3), np.full(3, rng.uniform(40, 220))])
        canvas.layers[CAR][inside] = paint
        window = np.zeros_like(mask)
        cv2.fillPoly(window, [_rotated_rect(cx, cy, 5, 6, angle)], 1)
        canvas.layers[CAR][window > 0] = paint * 0.35
        mask[inside] = CAR


def _draw_clutter(mask: np.ndarray, canvas: _Canvas, rng: np.random.Generator) -> None:
    size = mask.shape[0]
    for _ in range(rng.integers(16, 26)):
        centre = rng.uniform(30, size - 30, 2)
        count = int(rng.integers(5, 9))
        angles = np.sort(rng.uniform(0, 2 * np.pi, count))
        radii = rng.uniform(12, 45, count)
        pts = centre + np.stack([np.cos(angles), np.sin(angles)], 1) * radii[:, None]
        blob = np.zeros_like(mask)
        cv2.fillPoly(blob, [pts.round().astype(np.int32)], 1)
        mask[(blob > 0) & (mask != BUILDING) & (mask != CAR)] = CLUTTER
