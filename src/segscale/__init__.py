"""segscale: config-driven semantic segmentation on one device or many.

From Python: ``segscale.load(ckpt).predict(image)`` labels images with a trained
network, ``segscale.train(overrides)`` trains as ``segscale-train`` does,
``segscale.evaluate(ckpt, overrides)`` evaluates as ``segscale-evaluate`` does. They live in
``segscale.api``, imported on first use, so ``import segscale`` itself loads neither
torch nor Lightning and changes no global state.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from segscale.version import __version__

if TYPE_CHECKING:
    from segscale.api import Predictor, TrainingFailedError, evaluate, load, train

_API = ("Predictor", "TrainingFailedError", "evaluate", "load", "train")
"""The names of ``segscale.api`` that ``segscale`` itself offers."""

__all__ = ["Predictor", "TrainingFailedError", "__version__", "evaluate", "load", "train"]


def __getattr__(name: str) -> Any:
    """``segscale.load``, ``segscale.train``, ...: ``segscale.api``'s, imported on first use."""
    if name in _API:
        return getattr(import_module("segscale.api"), name)
    raise AttributeError(f"module 'segscale' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
