"""Applying a trained network to whole images: prediction, evaluation and export.

The sliding window (with its test-time augmentation), the ranks and the image progress
are shared by ``prediction`` (``predict.py``), ``evaluation`` (``evaluate.py``) and
``export`` (``export.py``).
"""

from segscale.inference.evaluation.image_metrics import read_image_metrics
from segscale.inference.evaluation.run import evaluate
from segscale.inference.export.check import ExportMismatchError
from segscale.inference.export.formats import ExportableNetwork, ExportSettings
from segscale.inference.export.run import ExportedNetwork, export_network
from segscale.inference.prediction.run import run_prediction
from segscale.inference.sliding_window import OnTiles, SlidingWindow

__all__ = [
    "ExportMismatchError",
    "ExportSettings",
    "ExportableNetwork",
    "ExportedNetwork",
    "OnTiles",
    "SlidingWindow",
    "evaluate",
    "export_network",
    "read_image_metrics",
    "run_prediction",
]
