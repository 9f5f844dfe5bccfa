"""The pixel types images come in, whether one suits a network; inputs checked from their headers.

Images are scaled by the full intensity of their pixel type (``MAX_VALUES``); a
checkpoint records the one it was trained with.

Whether input images suit a network, read from their headers alone (before decoding).

Used before a prediction run: every input is checked at once, so an unusable file
stops the run before anything is predicted.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from segscale.data.storage.sources import (
    DEFAULT_MAX_IMAGE_PIXELS,
    READ_ERRORS,
    FileProblem,
    describe_read_error,
    read_image_header,
)

MAX_VALUES = {"uint8": 255.0, "uint16": 65535.0, "float32": 1.0}
"""The value of full intensity for each pixel type (images are scaled by it)."""


def pixel_type_mismatch(dtype: str, max_value: float, expected_by: str) -> str | None:
    """Why pixels of ``dtype`` do not suit what ``expected_by`` takes; ``None`` if they do.

    ``max_value`` is the full intensity that ``expected_by`` scales pixels by (a
    checkpoint's): 255 means 8-bit images, 65535 16-bit, 1.0 float. Another pixel type
    would be normalized on the wrong scale (16-bit pixels into an 8-bit network read as
    up to 257 times full intensity).
    """
    if MAX_VALUES.get(dtype) == max_value:
        return None
    known = [name for name, value in MAX_VALUES.items() if value == max_value]
    wanted = f"{known[0]} pixels" if known else "pixels"
    return (
        f"its pixels are {dtype}, {expected_by} takes {wanted} (full intensity "
        f"{max_value:g}); convert the image to {known[0] if known else 'that type'}"
    )


def check_image_headers(
    paths: Sequence[Path],
    in_channels: int,
    channels_from: str,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    max_value: float | None = None,
) -> list[FileProblem]:
    """Every image of ``paths`` that cannot be used, judged by its header alone.

    Nothing is decoded (see ``read_image_header``): each file is opened, its declared
    size checked against ``max_image_pixels``, its channels against ``in_channels``
    (``channels_from`` says whose number that is, for the message), its pixel type
    against ``max_value`` if given (``pixel_type_mismatch``), and a PNG's chunk
    checksums are verified. A file that passes may still fail while being decoded (a
    truncated JPEG body).
    """
    problems: list[FileProblem] = []
    for path in paths:
        try:
            header = read_image_header(path, max_image_pixels)
        except READ_ERRORS as error:
            problems.append(
                FileProblem(path, f"cannot be read: {describe_read_error(path, error)}")
            )
            continue
        if header.channels != in_channels:
            problems.append(
                FileProblem(
                    path, f"has {header.channels} channels, {channels_from} takes {in_channels}"
                )
            )
            continue
        mismatch = (
            None
            if max_value is None
            else pixel_type_mismatch(header.dtype, max_value, channels_from)
        )
        if mismatch:
            problems.append(FileProblem(path, mismatch))
    return problems
