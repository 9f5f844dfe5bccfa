"""The step model's argument checks: a ``ValueError`` naming the argument and its value.

The model is arithmetic on measured numbers; a zero, negative or non-finite one would
give a prediction that looks like any other, so each constructor and function refuses it.
"""

from __future__ import annotations

import math


def require_positive(value: float, name: str, unit: str) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number above 0."""
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number of {unit}, got {value!r}")


def require_non_negative(value: float, name: str, unit: str) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number of at least 0."""
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be >= 0 {unit}, got {value!r}")


def require_count(value: int, name: str, minimum: int) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def require_devices(n: int, name: str = "n") -> None:
    """Raise ``ValueError`` unless ``n`` is a number of devices: an integer of at least 1."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be an integer number of devices >= 1, got {n!r}")
