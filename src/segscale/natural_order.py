"""Natural order of names: ``class_2`` before ``class_10``, as a reader counts."""

from __future__ import annotations

import re

_NUMBERS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders the digit runs of ``text`` by value, the rest as text.

    ``sorted(["IoU_class_10", "IoU_class_2"], key=natural_key)`` puts ``class_2``
    first; names without digits keep their alphabetical order.
    """
    # (0, number) and (1, text) never compare a number with a string.
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in _NUMBERS.split(text) if part
    )
