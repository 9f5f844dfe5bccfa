"""The images a prediction reads: which files ``input`` names, and their pixels, checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from segscale.data.sources import IMAGE_SUFFIXES, READ_ERRORS, describe_read_error, read_image
from segscale.errors import ConfigError
from segscale.inference.georeference import Georeference, read_georeference


class UnreadableImageError(ConfigError):
    """Input images that cannot be read; the message names each one and why."""


def input_images(value: str) -> list[Path]:
    """The images that ``input`` names: an image, a folder of images, or a .txt list.

    A list names one image path per line (relative to the list's folder or absolute);
    blank lines and ``#`` comments are skipped. Outputs are named by file stem, so two
    inputs with the same stem are refused.
    """
    path = Path(value)
    if path.is_dir():
        images = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    elif path.suffix.lower() == ".txt" and path.is_file():
        lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
        images = [path.parent / line for line in lines if line]
    elif path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
        images = [path]
    else:
        raise ConfigError(
            f"input={value!r} is not an image, a folder or a .txt list; expected one of "
            f"those (images: {', '.join(IMAGE_SUFFIXES)})"
        )
    missing = [str(p) for p in images if not p.is_file()]
    if missing or not images:
        raise ConfigError(f"input={value!r}: " + (f"missing {missing}" if missing else "no images"))
    stems: dict[str, Path] = {}
    for image in images:
        if image.stem in stems:
            raise ConfigError(f"input={value!r}: {image} and {stems[image.stem]} share a name")
        stems[image.stem] = image
    return images


def read_input_image(path: Path, in_channels: int, max_image_pixels: int | None) -> np.ndarray:
    """The pixels (H×W×C) of the image file ``path``, for a network of ``in_channels``.

    Raises ``UnreadableImageError`` naming ``path`` if it cannot be decoded (or is past
    ``max_image_pixels``), and ``ConfigError`` if its channels are not the network's.
    """
    try:
        image = read_image(path, max_image_pixels)
    except READ_ERRORS as error:
        reason = describe_read_error(path, error)
        raise UnreadableImageError(f"{path}: cannot be decoded: {reason}") from error
    if image.shape[2] != in_channels:
        raise ConfigError(
            f"{path}: has {image.shape[2]} channels, the network of ckpt takes {in_channels}"
        )
    return image


def read_input_georeference(path: Path) -> Georeference | None:
    """The georeferencing that the image file ``path`` declares (GeoTIFF tags), or ``None``.

    Reads tags only, no pixels. Raises ``UnreadableImageError`` naming ``path`` if its
    tags cannot be read.
    """
    try:
        return read_georeference(path)
    except READ_ERRORS as error:
        reason = describe_read_error(path, error)
        raise UnreadableImageError(f"{path}: its tags cannot be read: {reason}") from error
