"""Palette PNG masks for tests: each file its own palette order (Dubai), or one palette (VOC)."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

DUBAI = [(60, 16, 152), (132, 41, 246), (110, 193, 228), (254, 221, 58), (226, 169, 41)]
"""Five class colours of the Humans in the Loop Dubai aerial set (building ... water)."""
UNLABELLED = (155, 155, 155)
"""Its "unlabelled" colour, a void value (``datamodule.ignore_ids``)."""


def write_palette_mask(
    path: Path,
    classes: np.ndarray,
    colours: Sequence[Sequence[int]],
    order: Sequence[int] | None = None,
    unused: Sequence[Sequence[int]] = (),
) -> None:
    """Write the class map ``classes`` as a palette PNG that shows class *c* in ``colours[c]``.

    Palette entry *i* holds the colour of class ``order[i]`` (``None``: class *i*'s, the
    indices being the class ids, as Pascal VOC's), followed by the ``unused`` colours;
    each pixel stores the index of its class's colour.
    """
    order = list(range(len(colours))) if order is None else list(order)
    index_of = np.zeros(256, np.uint8)
    index_of[order] = np.arange(len(order))
    palette = [colours[c] for c in order] + [tuple(c) for c in unused]
    picture = Image.fromarray(index_of[classes])  # an "L" image becomes "P", values unchanged
    picture.putpalette([v for colour in palette for v in colour])
    path.parent.mkdir(parents=True, exist_ok=True)
    picture.save(path)
    assert Image.open(path).mode == "P"


def voc_palette() -> np.ndarray:
    """Pascal VOC's palette (256×3 uint8): index bits spread over the colour's high bits."""
    index = np.arange(256)
    palette = np.zeros((256, 3), np.int64)
    for shift in range(8):
        for channel in range(3):
            bit = (index >> (3 * shift + channel)) & 1
            palette[:, channel] |= bit << (7 - shift)
    return palette.astype(np.uint8)


def write_short_palette_png(
    path: Path, indices: np.ndarray, palette: Sequence[Sequence[int]]
) -> None:
    """An 8-bit palette PNG whose ``indices`` may lie beyond its ``palette``.

    Written chunk by chunk: Pillow writes no index its palette lacks (it narrows the bit
    depth to the palette). Such files exist (other writers), and Pillow reads them.
    """

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    height, width = indices.shape
    rows = b"".join(b"\x00" + row.astype(np.uint8).tobytes() for row in indices)
    header = struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0)  # 8 bits, palette
    colours = bytes(v for colour in palette for v in colour)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"PLTE", colours)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
