"""Generated datasets of 4096×4096 RGB tiles: deflate-compressed, 256×256-tiled GeoTIFFs or PNGs.

Each tile is assembled from a pool of 64 distinct 256×256 blocks (smooth noise quantized
to steps of 16: it compresses about 8.6× with deflate), in an order drawn per tile, so
that the tiles differ. The blocks are compressed once: a GeoTIFF is written from the
compressed blocks as they are (tifffile writes pre-compressed tiles), which makes
hundreds of tiles a matter of seconds and their decoded size a matter of choice. The
mask of a block is its first channel // 43 (class indices 0..5). Every tile carries a
GeoTIFF georeference (UTM 33N, 0.5 m pixels).

    train/images/tileNNNN.tif, train/masks/tileNNNN.tif   the training tiles
    val/images/tile0000.tif, val/masks/tile0000.tif       one validation tile
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image

SIDE, BLOCK, POOL, QUANTUM = 4096, 256, 64, 16
BLOCKS = (SIDE // BLOCK) ** 2
# GeoTIFF tags: pixel scale, a tie point, and the keys of a projected CRS (EPSG:32633).
GEO_TAGS = [
    (33550, "d", 3, (0.5, 0.5, 0.0), True),
    (33922, "d", 6, (0.0, 0.0, 0.0, 500000.0, 5800000.0, 0.0), True),
    (34735, "H", 16, (1, 1, 0, 3, 1024, 0, 1, 1, 1025, 0, 1, 1, 3072, 0, 1, 32633), True),
]


def block_pool() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The 64 image blocks (256×256×3 uint8) and their masks (256×256 class indices)."""
    images, masks = [], []
    for i in range(POOL):
        rng = np.random.default_rng(i)
        small = rng.integers(0, 256, (BLOCK // 32, BLOCK // 32, 3), dtype=np.uint8)
        image = np.asarray(Image.fromarray(small).resize((BLOCK, BLOCK), Image.BILINEAR))
        image = (image // QUANTUM * QUANTUM).astype(np.uint8)
        images.append(image)
        masks.append((image[:, :, 0] // 43).astype(np.uint8))
    return images, masks


def block_order(index: int) -> np.ndarray:
    """Which pool block each of a tile's 256 blocks is, row by row."""
    return np.random.default_rng(1000 + index).integers(0, POOL, BLOCKS)


def assemble(blocks: list[np.ndarray], order: np.ndarray) -> np.ndarray:
    """A whole decoded tile from its blocks (for PNGs, which are compressed whole)."""
    per_row = SIDE // BLOCK
    rows = [
        np.concatenate([blocks[k] for k in order[r * per_row : (r + 1) * per_row]], 1)
        for r in range(per_row)
    ]
    return np.concatenate(rows, 0)


def write_dataset(root: Path, count: int, kind: str = "tif") -> dict[str, float]:
    """``count`` training tiles and one validation tile under ``root`` (kept if complete).

    ``kind`` is ``tif`` (compressed tiled GeoTIFFs) or ``png``. Returns the decoded and
    on-disk sizes of the training tiles (bytes).
    """
    images, masks = block_pool()
    packed = (
        [zlib.compress(b.tobytes(), 6) for b in images],
        [zlib.compress(b.tobytes(), 6) for b in masks],
    )
    for split in ("train", "val"):
        for sub in ("images", "masks"):
            (root / split / sub).mkdir(parents=True, exist_ok=True)
    for i in range(count):
        order = block_order(i)
        for split in ("train", "val") if i == 0 else ("train",):
            for sub, pool, blocks in (("images", packed[0], images), ("masks", packed[1], masks)):
                path = root / split / sub / f"tile{i:04d}.{kind}"
                if path.exists():
                    continue
                partial = path.with_name(path.name + ".part")
                if kind == "png":
                    Image.fromarray(assemble(blocks, order)).save(
                        partial, format="PNG", compress_level=1
                    )
                else:
                    write_geotiff(partial, [pool[k] for k in order], sub == "images")
                partial.rename(path)
    train = list((root / "train").rglob(f"*.{kind}"))
    return {
        "tiles": count,
        "decoded_bytes": count * SIDE * SIDE * 4,  # RGB image + mask, uint8
        "disk_bytes": sum(p.stat().st_size for p in train),
    }


def write_geotiff(path: Path, blocks: list[bytes], rgb: bool) -> None:
    """A 4096² tiled GeoTIFF from deflate-compressed 256² blocks, written as they are."""
    tifffile.imwrite(
        path,
        iter(blocks),
        shape=(SIDE, SIDE, 3) if rgb else (SIDE, SIDE),
        dtype=np.uint8,
        tile=(BLOCK, BLOCK),
        compression="zlib",
        photometric="rgb" if rgb else "minisblack",
        extratags=GEO_TAGS,
    )
