"""Image files whose header declares a size their data does not have."""

import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image


def png_declaring(path: Path, width: int, height: int) -> Path:
    """A small PNG whose header (IHDR, checksum fixed) declares ``width`` × ``height``.

    Its pixel data is that of an 8×8 image, so decoding it fails as truncated: a test
    that sees that error knows the size check let it through.
    """
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path)
    data = bytearray(path.read_bytes())
    # IHDR follows the 8-byte signature: length (4), type (4), width and height (4 + 4)...
    struct.pack_into(">II", data, 16, width, height)
    # ... then 5 more header bytes and the CRC of type + data.
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    path.write_bytes(bytes(data))
    return path
