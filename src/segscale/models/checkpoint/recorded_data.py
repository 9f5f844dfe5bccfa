"""The data of an evaluation: by default those the checkpoint was trained on.

``train.py`` stores the run's ``datamodule.source`` in the checkpoint (``data_source``,
resolved, its ``root`` absolute). ``evaluate.py`` without data on its command line
evaluates those, not the ``datamodule`` its config composes by default (the embedded
synthetic set): a network trained on a folder scores near zero on generated tiles, and
would do so silently. Data named on the command line (``datamodule=folder``,
``datamodule.source.root=...``) that differ from the checkpoint's are refused, naming
both, unless ``other_data=true`` says that other data are meant.

The stored source is a file's content, so it is rebuilt only for the sources segscale
ships, with plain values: a checkpoint never names code to run.
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from segscale.data.datasets.folder import FolderTiles
from segscale.data.datasets.synthetic import SyntheticTiles
from segscale.errors import ConfigError
from segscale.models.checkpoint.record import data_source_record
from segscale.models.checkpoint.trained import TrainedModel

log = logging.getLogger(__name__)

SOURCE_KINDS: dict[str, type] = {
    f"{kind.__module__}.{kind.__qualname__}": kind for kind in (FolderTiles, SyntheticTiles)
}
KNOWN_SOURCES = tuple(SOURCE_KINDS)
"""The ``_target_`` of every source that a checkpoint's ``data_source`` may name."""


def use_checkpoint_data(
    datamodule: DictConfig, trained: TrainedModel, ckpt: str, given: bool, other_data: bool
) -> None:
    """Make ``datamodule.source`` (in place) the data the ``trained`` model was trained on.

    ``given``: the command line named data; they are kept if they are the checkpoint's
    or ``other_data`` is true, and refused (``ConfigError`` naming both) otherwise. Not
    given: the checkpoint's replace the composed default.
    """
    trained_on = trained.record.data_source
    composed = data_source_record(datamodule.source)
    if composed == trained_on:  # both resolved, every key present
        return
    if given:
        if other_data:
            log.info(
                "other_data=true: evaluating %s; ckpt was trained on %s",
                describe(composed),
                describe(trained_on),
            )
            return
        raise ConfigError(
            f"datamodule.source is {describe(composed)}, but ckpt={ckpt!r} was trained on "
            f"{describe(trained_on)}; leave out datamodule and datamodule.source.* to "
            "evaluate on the latter, or give other_data=true to evaluate on the former"
        )
    _check_rebuildable(trained_on, ckpt)
    log.info("evaluating the data ckpt was trained on: %s", describe(trained_on))
    with open_dict(datamodule):
        datamodule.source = OmegaConf.create(trained_on)


def describe(source: dict[str, Any]) -> str:
    """A source for messages: its class and arguments, ``FolderTiles(root='/data', ...)``."""
    kind = str(source.get("_target_", "?")).rsplit(".", 1)[-1]
    arguments = ", ".join(f"{key}={value!r}" for key, value in source.items() if key != "_target_")
    return f"{kind}({arguments})"


def _check_rebuildable(source: dict[str, Any], ckpt: str) -> None:
    """Refuse a stored source that is not a shipped one with plain values."""
    target = source.get("_target_")
    if target not in KNOWN_SOURCES:
        raise ConfigError(
            f"ckpt={ckpt!r} was trained on data of datamodule.source._target_={target!r}, "
            f"which evaluate.py does not rebuild from a checkpoint (it rebuilds "
            f"{', '.join(KNOWN_SOURCES)}); give the data on the command line "
            "(datamodule=... datamodule.source...=...)"
        )
    if not _plain({key: value for key, value in source.items() if key != "_target_"}):
        raise ConfigError(
            f"ckpt={ckpt!r}: its data_source holds values other than plain numbers, "
            "strings and lists, or an interpolation (${...}); expected what train.py "
            "writes; give the data on the command line (datamodule=... "
            "datamodule.source...=...)"
        )


def _plain(value: Any) -> bool:
    """Whether ``value`` holds only plain values: no interpolation, no key Hydra acts on."""
    if isinstance(value, dict):
        keys = all(isinstance(key, str) and not key.startswith("_") for key in value)
        return keys and all(_plain(item) for item in value.values())
    if isinstance(value, list):
        return all(_plain(item) for item in value)
    if isinstance(value, str):
        return "${" not in value
    return value is None or isinstance(value, (bool, int, float))
