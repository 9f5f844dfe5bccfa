"""The images a prediction reads: which files ``input`` names, and their pixels, checked."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from segscale.data.checks.value_range import ValueRange, value_range_problem
from segscale.data.datasets.lists import (
    read_list_text,
    resolve_listed,
    windows_form,
    windows_hint,
)
from segscale.data.storage.pixel_types import pixel_type_mismatch
from segscale.data.storage.rasters import Pixels
from segscale.data.storage.sources import (
    IMAGE_SUFFIXES,
    READ_ERRORS,
    describe_read_error,
    read_image,
)
from segscale.errors import ConfigError
from segscale.inference.prediction.georeference import Georeference, read_georeference
from segscale.models.checkpoint.trained import TrainedModel


class UnreadableImageError(ConfigError):
    """Input images that cannot be read; the message names each one and why."""


def input_images(value: str) -> list[Path]:
    """The images that ``input`` names: an image, a folder of images, or a .txt list.

    A list names one image path per line (relative to the list's folder or absolute);
    blank lines and ``#`` comments are skipped; one written on Windows is read as such
    (``listed_images``). Outputs are named by file stem, so two inputs with the same stem
    are refused (``check_output_names`` refuses the rest).
    """
    path = Path(value)
    if path.is_dir():
        images = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    elif path.suffix.lower() == ".txt" and path.is_file():
        images = listed_images(path)
    elif path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
        images = [path]
    elif not path.exists():
        # exists() follows links: a dangling one is named as such
        what = f"is a link to {path.readlink()}, which " if path.is_symlink() else ""
        raise ConfigError(
            f"input={value!r} {what}does not exist; expected an image, a folder or "
            "a .txt list of image paths"
        )
    else:
        raise ConfigError(
            f"input={value!r} is not an image, a folder or a .txt list; expected one of "
            f"those (images: {', '.join(IMAGE_SUFFIXES)})"
        )
    missing = [str(p) for p in images if not p.is_file()]
    if missing or not images:
        hint = f"; {windows_hint(LISTED_FROM)}" if any(windows_form(m) for m in missing) else ""
        found = f"missing {missing}{hint}" if missing else "no images"
        raise ConfigError(f"input={value!r}: {found}")
    stems: dict[str, Path] = {}
    for image in images:
        if image.stem in stems:
            raise ConfigError(f"input={value!r}: {image} and {stems[image.stem]} share a name")
        stems[image.stem] = image
    return images


LISTED_FROM = "the list's folder (or absolute)"
"""What the paths of an input list start from, in words (messages)."""


def listed_images(listing: Path) -> list[Path]:
    r"""The image paths of the input list ``listing``, one a line, as its lines name them.

    Relative paths start from the list's folder. The text is UTF-8 or UTF-16, CRLF line
    ends included (``read_list_text``); a path in Windows' form (``tiles\a.png``,
    ``D:\survey\tiles\a.png``) that is not there as written is looked for by its
    trailing parts under the list's folder (``resolve_listed``), and kept as written if
    it is nowhere.
    """
    images = []
    for line in read_list_text(listing).splitlines():
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        image = listing.parent / entry
        if not image.is_file() and windows_form(entry):
            image = resolve_listed(entry, (listing.parent,)) or image
        images.append(image)
    return images


OVERLAY_SUFFIX = "_overlay"
"""What an overlay's name adds to its image's stem: ``scene.png`` → ``scene_overlay.png``."""


def output_stems(image: Path, overlay: bool, extra: Sequence[str] = ()) -> list[str]:
    """The names (without suffix) of the files written for ``image``: mask, then overlay.

    ``extra``: what other outputs add to the mask's name (``_probabilities``, ...).
    """
    stems = [image.stem, image.stem + OVERLAY_SUFFIX] if overlay else [image.stem]
    return stems + [image.stem + suffix for suffix in extra]


def check_output_names(
    images: list[Path], overlay: bool, extra: Sequence[str] = (), key: str = "input"
) -> None:
    """Refuse inputs whose outputs would share a name, before anything is written.

    With overlays, ``scene.tif`` and ``scene_overlay.tif`` would both write
    ``scene_overlay.<format>``: the second's mask over the first's overlay. ``extra``
    names the other outputs as ``output_stems`` does; names are compared without their
    suffix, whatever the formats.
    """
    writer: dict[str, Path] = {}
    for image in images:
        for stem in output_stems(image, overlay, extra):
            if stem in writer and writer[stem] != image:
                added = ", ".join(repr(suffix) for suffix in (OVERLAY_SUFFIX, *extra))
                fewer = "overlay=false" + (", probabilities=none, confidence=none" if extra else "")
                raise ConfigError(
                    f"{key}: {writer[stem]} and {image} would both write the output "
                    f"{stem!r} (a mask is named for its image, the other outputs add "
                    f"{added}); rename one of them, or give {fewer}"
                )
            writer[stem] = image


def read_input_image(
    path: Path,
    in_channels: int,
    max_image_pixels: int | None,
    max_value: float | None = None,
    network: str = "the network of ckpt",
    value_range: ValueRange | None = None,
) -> Pixels:
    """The pixels (H×W×C) of the image file ``path``, for a network of ``in_channels``.

    A TIFF is not decoded here: it is memory-mapped or read by window as the sliding
    window reads it (``read_image``).

    With ``max_value`` (the checkpoint's full intensity) the pixel type must be the one
    the network was trained on, and float pixels finite; with ``value_range`` too, the
    values must not be far outside it (``check_pixels``). ``network`` names it in the
    messages (``the network of ckpt='run/best.ckpt'``).

    Raises ``UnreadableImageError`` naming ``path`` if it cannot be decoded (or is past
    ``max_image_pixels``), and ``ConfigError`` if its channels or pixels are not the
    network's.
    """
    try:
        image = read_image(path, max_image_pixels)
    except READ_ERRORS as error:
        reason = describe_read_error(path, error)
        raise UnreadableImageError(f"{path}: cannot be decoded: {reason}") from error
    if image.shape[2] != in_channels:
        raise ConfigError(f"{path}: has {image.shape[2]} channels, {network} takes {in_channels}")
    if max_value is not None:
        check_pixels(path, image, max_value, network, value_range)
    return image


def check_pixels(
    what: Path | str,
    image: Pixels,
    max_value: float,
    network: str = "the network of ckpt",
    value_range: ValueRange | None = None,
) -> None:
    """Raise ``ConfigError`` naming ``what`` unless ``image`` suits a network of ``max_value``.

    The pixel type must be the training images' (``pixel_type_mismatch``); float pixels
    must also be finite, as a NaN spreads through every tile it touches; and with
    ``value_range`` (the training images', as the checkpoint records it) the values must
    not be on another scale (``value_range_problem``: a float image of 0-255 for a
    network trained on 0-1 would give an unrelated mask). ``what``: the image's file (or
    a description of an array); ``network``: the network, for the message.
    """
    mismatch = pixel_type_mismatch(image.dtype.name, max_value, network)
    if mismatch:
        raise ConfigError(f"{what}: {mismatch}")
    if image.dtype.kind == "f" and not _all_finite(image):
        raise ConfigError(f"{what}: has NaN or infinite pixels; expected finite values")
    problem = value_range_problem(image, value_range) if value_range is not None else None
    if problem:
        raise ConfigError(
            f"{what}: {problem}, which {network} recorded: are its values on another scale "
            "(0-255 for 0-1, 16-bit for 12-bit data)? Scale it as the training images were, "
            f"or give {RANGE_CHECK_KEY}=false to predict it anyway"
        )


RANGE_CHECK_KEY = "check_value_range"
"""The config key (of predict.py, evaluate.py, ``segscale.load``'s overrides) that turns
the value range check off."""


def range_checked(trained: TrainedModel, check: object) -> TrainedModel:
    """``trained`` as inputs are checked against: without its value range if ``check`` is false.

    ``check``: the value of ``check_value_range`` (true or false: the schema's check).
    """
    return trained if check else dataclasses.replace(trained, checks_value_range=False)


def _all_finite(image: Pixels) -> bool:
    """Whether every pixel is finite, checked in bands (the image may be memory-mapped)."""
    row_values = int(np.prod(image.shape[1:]))  # H×W arrays (one channel) included
    rows = max(1, (1 << 24) // max(1, row_values))
    return all(np.isfinite(image[y : y + rows]).all() for y in range(0, image.shape[0], rows))


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
