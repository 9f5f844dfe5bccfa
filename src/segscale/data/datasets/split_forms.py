"""The forms a split of ``datamodule.source.splits`` takes, and their checks.

A split is a name (a folder with ``images/`` and ``masks/``, else a list), a mapping of
an image folder and a mask folder, a list file, or a tree: every ``images`` folder with
a ``masks`` folder beside it, at any depth (``segscale.data.datasets.trees``), all of its
pairs or a part chosen by a list, a share, or as the rest of another split
(``segscale.data.datasets.trees``). A form the checks do not know is refused.
"""

from __future__ import annotations

from collections.abc import Mapping

from omegaconf import OmegaConf

from segscale.errors import ConfigError

SPLIT_KEYS = {
    "images": "the split's image folder",
    "masks": "the split's mask folder",
    "list": "the split's list file",
    "tree": "the folder whose images/ and masks/ folders, at any depth, hold the split",
    "share": "the share of the tree's pairs the split takes",
    "except": "the split whose pairs the tree's others make this one",
}
"""The keys of a split given as a mapping, and what each names (under the root)."""

TREE_CHOICES = ("list", "share", "except")
"""The keys that choose a part of a tree's pairs, one at most per split."""


def check_splits(splits: object) -> None:
    """Raise ``ConfigError`` for a ``datamodule.source.splits`` value of the wrong form.

    Each split is a name (``str``), ``null``, or a mapping of ``SPLIT_KEYS``: ``images``
    and ``masks``; ``list`` (with or without them); or ``tree`` (with folder names for
    ``images`` and ``masks``, and at most one of ``list``, ``share`` in (0, 1) and
    ``except``, which names another split of ``splits`` that is not an ``except`` itself).
    """
    if not isinstance(splits, Mapping):
        raise ConfigError(
            f"datamodule.source.splits={shown(splits)!r} is not allowed: expected a mapping "
            "from split (train, val, test) to its files, e.g. {train: train, val: val}"
        )
    for name, entry in splits.items():
        if entry is None or isinstance(entry, str):
            continue
        split = str(name)
        key = f"datamodule.source.splits.{split}"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{key}={shown(entry)!r} is not allowed: expected {forms(split)}")
        _check_values(key, entry)
        why = _tree_problem(split, entry, splits) if "tree" in entry else _folder_problem(entry)
        if why:
            raise ConfigError(
                f"{key}={shown(entry)!r} is not allowed ({why}): expected {forms(split)}"
            )


def _check_values(key: str, entry: Mapping[str, object]) -> None:
    """Each key of ``entry`` known, and its value of its kind (``share`` a number)."""
    unknown = [str(k) for k in entry if k not in SPLIT_KEYS]
    if unknown:
        raise ConfigError(
            f"{key}={shown(entry)!r} is not allowed (unknown key {unknown[0]!r}): expected "
            f"{forms(key.rsplit('.', 1)[1])}"
        )
    for item, value in entry.items():
        if item == "share":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
                raise ConfigError(
                    f"{key}.share={shown(value)!r} is not allowed: expected {SPLIT_KEYS['share']}, "
                    "a number between 0 and 1 (0.2: a fifth)"
                )
        elif not isinstance(value, str):
            raise ConfigError(
                f"{key}.{item}={shown(value)!r} is not allowed: expected "
                f"{SPLIT_KEYS[str(item)]}, a path under datamodule.source.root"
            )


def _folder_problem(entry: Mapping[str, object]) -> str:
    """Why a split without ``tree`` is of no form (``""``: it is of one)."""
    chooser = [k for k in ("share", "except") if k in entry]
    if chooser:
        return f"{chooser[0]} chooses among the pairs of a tree: it needs tree"
    if "list" not in entry and not {"images", "masks"} <= set(entry):
        return "it needs images and masks"
    return ""


def _tree_problem(split: str, entry: Mapping[str, object], splits: Mapping[str, object]) -> str:
    """Why a split with ``tree`` is of no form (``""``: it is of one)."""
    chosen = [k for k in TREE_CHOICES if k in entry]
    if len(chosen) > 1:
        return f"{' and '.join(chosen)}: a tree's part is chosen by one of them"
    for item in ("images", "masks"):
        if item in entry and not is_folder_name(str(entry[item])):
            return f"{item}={entry[item]!r}: in a tree, the name of its {item} folders, not a path"
    if "except" not in entry:
        return ""
    other = str(entry["except"])
    if other == split or not splits.get(other):
        named = "itself" if other == split else "no split that is set"
        return f"except={other!r} names {named}; expected another split, e.g. except: val"
    target = splits[other]
    if isinstance(target, Mapping) and "except" in target:
        return f"except={other!r} names a split that is itself the rest of another"
    return ""


def is_folder_name(name: str) -> bool:
    """Whether ``name`` names a folder by itself: not empty, ``.``/``..``, nor a path."""
    return name not in ("", ".", "..") and not any(sep in name for sep in "/\\")


def forms(split: str, masks: str = "<mask folder>") -> str:
    """The forms a split may take, for messages (``masks``: the example's mask folder)."""
    key = f"datamodule.source.splits.{split}"
    return (
        f"one of: {key}={split} (a folder under datamodule.source.root with images/ and "
        f"masks/, or else the list {split}.txt); {key}={{images:{split},masks:{masks}}} "
        f"(an image folder and a mask folder under the root); {key}={{list:{split}.txt}} "
        "(a list file under the root: an image name, or an image and a mask path, per "
        f"line); {key}={{tree:.}} (every images/ folder with a masks/ folder beside it, at "
        "any depth under the root; with list:<file>, share:<0 to 1> or except:<split>, a "
        "part of them)"
    )


def shown(value: object) -> object:
    """``value`` as plain Python, for messages (a config node shows as a dict or list)."""
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
