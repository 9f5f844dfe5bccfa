"""Whether input images suit a network, read from their headers alone (before decoding).

Used before a prediction run: every input is checked at once, so an unusable file
stops the run before anything is predicted.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from segscale.data.storage.pixel_types import pixel_type_mismatch
from segscale.data.storage.sources import (
    DEFAULT_MAX_IMAGE_PIXELS,
    READ_ERRORS,
    FileProblem,
    describe_read_error,
    read_image_header,
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
