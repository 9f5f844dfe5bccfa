"""Config keys that moved: the old name is refused with one line that names the new one.

A run folder recorded with an old key, a command line or a preset written for an older
segscale would otherwise meet Hydra's "not in struct" error, which names no successor.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from segscale.errors import EXIT_BAD_INPUT, ConfigError

Main = TypeVar("Main", bound=Callable[..., Any])

MOVED_KEYS = {
    "strategy.sync_batchnorm": (
        "training.sync_batchnorm",
        "synchronized batch norm converts the network; the strategy group is Lightning's "
        "strategy alone",
    ),
    "training.preemption_exit_s": (
        "training.preemption_deadline_s",
        "the deadline now counts from the start of the stop, not from the signal",
    ),
    "inference.flip_tta": (
        "inference.tta",
        "flip_tta=true is tta=flip, false is tta=none; tta also takes d4, and "
        "inference.tta_scales adds scales",
    ),
}
"""Old key → (new key, why it moved)."""


def _message(old: str) -> str:
    new, why = MOVED_KEYS[old]
    return f"{old} is now {new} ({why}): write {new}=... instead"


def refuse_moved_overrides(overrides: Sequence[str]) -> None:
    """Raise ``ConfigError`` for the first override (``key=value``) that sets a moved key."""
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~") if "=" in override else None
        if key in MOVED_KEYS:
            raise ConfigError(_message(key))


def refusing_moved_keys(main: Main) -> Main:
    """``main`` (a Hydra entry point) that first refuses a moved key of the command line.

    Hydra would compose first and stop at "Key ... is not in struct", which names no
    successor; this says the new key on stderr and exits 2 (``EXIT_BAD_INPUT``).
    """

    @functools.wraps(main)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            refuse_moved_overrides(sys.argv[1:])
        except ConfigError as error:
            print(f"Error: {error}", file=sys.stderr)
            sys.exit(EXIT_BAD_INPUT)
        return main(*args, **kwargs)

    return checked  # type: ignore[return-value]  # same signature, by functools.wraps


def renamed_overrides(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with each moved key written under its new name (a run folder's record).

    A run recorded before a key moved resumes with the same values: its record is not the
    user's to edit, so it is read in today's names instead of refused.
    """
    renamed = []
    for override in overrides:
        key, sep, value = override.partition("=")
        prefix = key[: len(key) - len(key.lstrip("+~"))]
        new = MOVED_KEYS.get(key.lstrip("+~"), (None, ""))[0]
        renamed.append(f"{prefix.replace('+', '')}{new}{sep}{value}" if sep and new else override)
    return renamed


def refuse_moved_config_keys(cfg: Mapping[str, Any]) -> None:
    """Raise ``ConfigError`` if the composed ``cfg`` still holds a moved key (a preset's)."""
    for old in MOVED_KEYS:
        group, _, key = old.partition(".")
        node = cfg.get(group)
        if isinstance(node, Mapping) and key in node:
            raise ConfigError(_message(old))
