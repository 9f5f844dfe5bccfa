"""The pixel types images come in, and whether one suits what a network takes.

Images are scaled by the full intensity of their pixel type (``MAX_VALUES``); a
checkpoint records the one it was trained with.
"""

from __future__ import annotations

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
