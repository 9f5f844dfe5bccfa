"""Weights from files: read without running code, loaded completely or refused.

Every file a user passes (a checkpoint, an encoder's weights) is read with
``torch.load(..., weights_only=True)``, or as ``.safetensors`` (which holds tensors
only): tensors and plain Python values only, so a shared file cannot run code through
its pickle. A state dict is loaded only when it fits the network key for key and shape
for shape; otherwise the error lists what is missing, unexpected or of another shape,
and names the file and the config key.
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import safetensors
import safetensors.torch
import torch
from torch import nn

from segscale.errors import ConfigError

SHOWN = 4
"""How many keys of each kind an error names before it gives the count."""

# What torch.load raises for a file that is not a weights-only archive: a pickle that
# refers to a global (code) it will not import, a damaged zip or pickle, a foreign file.
LOAD_ERRORS = (
    pickle.UnpicklingError,
    RuntimeError,
    EOFError,
    ValueError,
    zipfile.BadZipFile,
    OSError,
)


def read_weights(path: Path, key: str, expected: str) -> Any:
    """The content of a ``torch.save`` or ``.safetensors`` file, read weights-only on the CPU.

    ``key`` names the config key that gave ``path`` and ``expected`` what it should
    be; both go into the error for a missing file, or one that is not a weights-only
    archive (truncated, damaged, or a pickle that would run code).
    """
    if not path.is_file():
        raise ConfigError(f"{key}={str(path)!r}: no such file; expected {expected}")
    if path.suffix == ".safetensors":
        return _read_safetensors(path, key, expected)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except PermissionError as error:
        raise ConfigError(
            f"{key}={str(path)!r} cannot be opened ({error.strerror}); expected {expected} "
            "that this user may read"
        ) from None
    except LOAD_ERRORS as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(
            f"{key}={str(path)!r} cannot be read as weights ({reason}): it is damaged, "
            f"truncated, or holds objects other than tensors and plain values, which are "
            f"never loaded because unpickling them could run code; expected {expected}"
        ) from None


def _read_safetensors(path: Path, key: str, expected: str) -> dict[str, torch.Tensor]:
    """A ``.safetensors`` file's tensors: the format holds nothing that could run code."""
    try:
        return safetensors.torch.load_file(path, device="cpu")
    except PermissionError as error:
        raise ConfigError(
            f"{key}={str(path)!r} cannot be opened ({error.strerror}); expected {expected} "
            "that this user may read"
        ) from None
    except (safetensors.SafetensorError, OSError) as error:
        raise ConfigError(
            f"{key}={str(path)!r} cannot be read as safetensors ({error}): it is damaged or "
            f"truncated; expected {expected}"
        ) from None


@dataclass(frozen=True)
class StateMismatch:
    """How a state dict differs from the one a network expects."""

    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    reshaped: tuple[str, ...]
    """Keys present in both with another shape, each as ``key (file A×B, network C×D)``."""

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.reshaped)

    def describe(self) -> str:
        """The differences, a few keys of each kind and then a count."""
        parts = [
            f"{len(keys)} {what}: {_few(keys)}"
            for what, keys in (
                ("missing", self.missing),
                ("unexpected", self.unexpected),
                ("with another shape", self.reshaped),
            )
            if keys
        ]
        return "; ".join(parts)


def compare_state(
    expected: Mapping[str, torch.Tensor],
    given: Mapping[str, Any],
    optional: Iterable[str] = (),
) -> StateMismatch:
    """How ``given`` differs from ``expected``; keys in ``optional`` may be missing."""
    optional = set(optional)
    missing = tuple(k for k in expected if k not in given and k not in optional)
    unexpected = tuple(k for k in given if k not in expected)
    reshaped = tuple(
        f"{k} (file {_shape(given[k])}, network {_shape(v)})"
        for k, v in expected.items()
        if k in given and _shape(given[k]) != _shape(v)
    )
    return StateMismatch(missing, unexpected, reshaped)


# Heads of ImageNet classifiers, which segmentation encoders drop: torchvision and timm
# ResNets (fc), MobileNets and EfficientNets (classifier), Cadene's pretrainedmodels
# (last_linear), timm's transformers and ConvNeXts (head).
CLASSIFIER_HEADS = ("fc.", "classifier.", "last_linear.", "head.")


ENCODER_FILE = "a local .pth, .pt or .safetensors file of encoder weights"

TIMM_PREFIX = "model."
"""smp's timm encoders (``tu-``) hold the timm feature extractor as ``model``."""


def load_encoder_weights(network: nn.Module, path: Path) -> None:
    """Load a local state dict (an encoder's, or a whole network's) into the encoder.

    The file is a ``.pth``/``.pt`` (read weights-only) or ``.safetensors`` file, and
    may be a Lightning-style ``{"state_dict": ...}``. Its keys may be the encoder's own,
    a whole network's (``encoder.`` prefix, stripped), torchvision's (the same keys as
    smp's ResNet encoders) or, for a ``tu-`` encoder, a plain timm model's (see
    ``timm_layout``). Every encoder weight must be in the file with its shape. Keys the
    encoder does not have are refused too (they mean the file is another encoder's,
    such as a ResNet-34's for a ResNet-18, whose first blocks would fit), except an
    ImageNet classifier's head (``fc.``, ``classifier.``, ...). Batch norm's
    ``num_batches_tracked`` counters may be missing (torchvision's files have none);
    they are not weights.
    """
    key = "model.encoder_weights"
    state = read_weights(path, key, ENCODER_FILE)
    if isinstance(state, Mapping) and isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]
    if not isinstance(state, Mapping):
        raise ConfigError(
            f"{key}={str(path)!r} holds a {type(state).__name__}, not a state dict; expected "
            f"{ENCODER_FILE}"
        )
    # Accept an encoder's own keys, or a whole network's with an "encoder." prefix.
    prefix = "encoder."
    if any(k.startswith(prefix) for k in state):
        state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    encoder = cast(nn.Module, network.encoder)  # an smp network's encoder
    expected = encoder.state_dict()
    if all(k.startswith(TIMM_PREFIX) for k in expected) and not any(
        k.startswith(TIMM_PREFIX) for k in state
    ):
        state = timm_layout(state, expected)
    state = {k: v for k, v in state.items() if k in expected or not k.startswith(CLASSIFIER_HEADS)}
    counters = [k for k in expected if k.endswith("num_batches_tracked")]
    mismatch = compare_state(expected, state, optional=counters)
    if mismatch:
        raise ConfigError(
            f"{key}={str(path)!r} does not fit the encoder "
            f"({type(encoder).__name__}): {mismatch.describe()}"
        )
    encoder.load_state_dict(state, strict=False)


def timm_layout(state: Mapping[str, Any], expected: Mapping[str, Any]) -> dict[str, Any]:
    """A plain timm model's state dict as smp's timm encoder (``tu-``) names its keys.

    smp holds timm's feature extractor as ``model``, so each key gains ``model.``; the
    extractor renames the children of top-level sequential modules (timm's
    ``FeatureListNet``: ``stages.0`` becomes ``stages_0``). Weights of top-level modules
    the extractor does not keep (the classifier, ConvNeXt's ``head``, EfficientNet's
    ``conv_head``, stages beyond ``encoder_depth``) are dropped, as timm drops them when
    it builds the extractor from a pretrained model; any other key stays, to be listed.
    """
    kept = {k.split(".")[1] for k in expected}  # the extractor's top-level modules
    mapped: dict[str, Any] = {}
    for k, value in state.items():
        plain, flattened = TIMM_PREFIX + k, TIMM_PREFIX + k.replace(".", "_", 1)
        if flattened in expected and plain not in expected:
            mapped[flattened] = value
        elif plain in expected or {_top(plain), _top(flattened)} & kept:
            mapped[plain] = value
    return mapped


def _top(key: str) -> str:
    """The top-level module of an smp timm encoder's key (after ``model.``)."""
    return key.split(".")[1]


def _few(keys: tuple[str, ...]) -> str:
    shown = ", ".join(keys[:SHOWN])
    return shown if len(keys) <= SHOWN else f"{shown}, ... ({len(keys) - SHOWN} more)"


def _shape(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is None:
        return type(value).__name__
    return "×".join(str(n) for n in shape) or "scalar"
