"""``model.init_from``: a fresh run's whole network initialised from a segscale checkpoint.

mmseg's ``load_from``: the encoder *and* decoder start from a trained network, a new
segmentation head when the classes differ. Only the weights are taken (not the
optimizer, epoch or schedule: continuing a run is ``ckpt_path``). The checkpoint is read
as ``ckpt_path`` is (weights-only, verified against its digest, its metadata checked),
and must be of the run's network: the same ``_target_``, architecture, encoder and
input channels, refused otherwise with both values named. Every weight must then fit key
for key and shape for shape, except the segmentation head when the class count differs:
the head keeps its fresh initialisation, and the log names its layers.

Class names that differ at the same count are loaded with a warning (fine-tuning on new
classes of the same number is what a user means). Normalisation must be the
checkpoint's: the weights learned from inputs normalised its way, so a null
``datamodule.mean``/``std`` means the checkpoint's (as a named ``encoder_weights`` means
its own), and a set one that differs is refused.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from segscale.errors import ConfigError
from segscale.models.checkpoint.reading import Checkpoint, read_checkpoint
from segscale.models.checkpoint.record import CheckpointRecord
from segscale.models.weights import compare_state

log = logging.getLogger(__name__)

KEY = "model.init_from"

HEAD = "segmentation_head."
"""The prefix of an smp network's head, the only layers re-initialised for new classes."""

IDENTITY = ("_target_", "arch", "encoder")
"""Network config keys that must equal the checkpoint's: another value is another network."""


@dataclass(frozen=True)
class InitSource:
    """A checkpoint read for ``model.init_from``: its record and its network's weights."""

    path: Path
    record: CheckpointRecord
    weights: dict[str, torch.Tensor]


def read_init_source(path: str | Path) -> InitSource:
    """The checkpoint ``model.init_from`` names, verified as ``ckpt_path`` is."""
    checkpoint = read_checkpoint(path, KEY)
    assert checkpoint.record is not None  # record_required
    return InitSource(checkpoint.path, checkpoint.record, checkpoint.network_weights(KEY))


def init_normalization(
    path: str | Path, mean: Sequence[float] | None, std: Sequence[float] | None
) -> dict[str, list[float]]:
    """The checkpoint's ``mean``/``std`` for those of ``datamodule.mean``/``std`` left null."""
    record = read_init_source(path).record
    return {
        key: [float(v) for v in getattr(record, key)]
        for key, value in (("mean", mean), ("std", std))
        if value is None
    }


def check_init_source_kept(path: str | Path, resumed: Checkpoint) -> None:
    """Refuse a resume that needs ``model.init_from``'s file once it is gone, saying why.

    A resume reads the file only for a checkpoint ``resumed`` without segscale's record
    (the normalization a null ``datamodule.mean``/``std`` took from it is then nowhere else).
    """
    if not Path(path).is_file():
        raise ConfigError(
            f"ckpt_path={str(resumed.path)!r}: the resumed run's {KEY}={str(path)!r} names a "
            "file that is gone, and the checkpoint does not record the normalization the run "
            "took from it (datamodule.mean/std null); put that file back to resume the run"
        )


def check_one_initialisation(model_cfg: Any) -> None:
    """Refuse ``model.init_from`` together with ``model.encoder_weights``, naming both."""
    path, encoder_weights = model_cfg.get("init_from"), model_cfg.get("encoder_weights")
    if path is not None and encoder_weights is not None:
        raise ConfigError(
            f"{KEY}={path!r} and model.encoder_weights={encoder_weights!r} are both set; "
            "set one: init_from loads the whole network (encoder included), encoder_weights "
            "the encoder alone"
        )


def load_whole_network(
    network: nn.Module,
    model_cfg: dict[str, Any],
    class_names: Sequence[str],
    normalization: dict[str, Sequence[float]],
) -> None:
    """Load ``model_cfg["init_from"]`` into ``network``, built from ``model_cfg``.

    ``class_names`` and ``normalization`` (``mean``, ``std``) are the run's. Refuses
    ``model.encoder_weights`` set as well, another network, other input channels,
    another normalisation, or weights that do not fit outside a re-initialised head.
    """
    path = model_cfg["init_from"]
    check_one_initialisation(model_cfg)
    source = read_init_source(path)
    _check_network(source, model_cfg)
    _check_normalization(source, normalization)
    theirs = list(source.record.class_names)
    expected = network.state_dict()
    new_head = len(theirs) != len(class_names)
    head = [k for k in expected if k.startswith(HEAD)] if new_head else []
    if new_head and not head:
        raise ConfigError(
            f"{KEY}={path!r} has {len(theirs)} classes, this run {len(class_names)}, and "
            f"{type(network).__name__} has no {HEAD.rstrip('.')} to re-initialise"
        )
    weights = {k: v for k, v in source.weights.items() if not k.startswith(HEAD) or not new_head}
    mismatch = compare_state(expected, weights, optional=head)
    if mismatch:
        raise ConfigError(
            f"{KEY}={path!r} does not fit the network {type(network).__name__} (a model "
            f"setting other than the checkpoint's?): {mismatch.describe()}"
        )
    network.load_state_dict(weights, strict=not head)
    if head:
        log.warning(
            "%s=%s: the checkpoint has %d classes, this run %d: re-initialised %s; "
            "every other layer loaded",
            KEY,
            path,
            len(theirs),
            len(class_names),
            ", ".join(head),
        )
    elif theirs != list(class_names):
        log.warning(
            "%s=%s: loaded, but the checkpoint's classes %s are not this run's %s: its "
            "head's outputs are taken as this run's classes, in that order",
            KEY,
            path,
            theirs,
            list(class_names),
        )
    else:
        log.info("%s=%s: every layer loaded", KEY, path)


def _check_network(source: InitSource, model_cfg: dict[str, Any]) -> None:
    """Refuse a checkpoint of another network or of other input channels, naming both."""
    theirs = source.record.model
    for name in IDENTITY:
        if theirs.get(name) != model_cfg.get(name):
            raise ConfigError(
                f"{KEY}={str(source.path)!r} holds a network of {name}={theirs.get(name)!r}, "
                f"this run's model.{name} is {model_cfg.get(name)!r}; set model.{name} to "
                "the checkpoint's, or initialise from a checkpoint of this network"
            )
    channels = theirs.get("in_channels", 3)
    if channels != model_cfg.get("in_channels"):
        raise ConfigError(
            f"{KEY}={str(source.path)!r} was trained on images of in_channels={channels}, "
            f"this run's have {model_cfg.get('in_channels')} (datamodule.in_channels); its "
            "first layer cannot take them"
        )


def _check_normalization(source: InitSource, normalization: dict[str, Sequence[float]]) -> None:
    """Refuse a run whose ``mean``/``std`` differ from the checkpoint's, naming both."""
    for key in ("mean", "std"):
        theirs, ours = getattr(source.record, key), list(normalization[key])
        same = len(theirs) == len(ours) and all(
            math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
            for a, b in zip(theirs, ours, strict=True)
        )
        if not same:
            raise ConfigError(
                f"{KEY}={str(source.path)!r} was trained on inputs normalised with "
                f"{key}={theirs}, this run's datamodule.{key} is {ours}; its weights expect "
                f"theirs: set datamodule.{key}=null (the checkpoint's) or to those values"
            )
