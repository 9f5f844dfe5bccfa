"""Figures sent to the metric trackers that show images: TensorBoard, MLflow, W&B.

Each tracker has its own call for an image; the CSV logger has none and gets nothing.
The figure is rendered once, as an RGB array, on the calling thread (a ``Figure`` of its
own, never pyplot's global state).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from matplotlib.figure import Figure
from PIL import Image

TRACKER_DPI = 72
"""Resolution of a tracker image: a figure per validation, so kept small."""


def image_loggers(loggers: Sequence[Logger]) -> list[Logger]:
    """The loggers among ``loggers`` that can show an image."""
    return [
        logger
        for logger in loggers
        if isinstance(logger, TensorBoardLogger | MLFlowLogger | WandbLogger)
    ]


def render(figure: Figure) -> np.ndarray:
    """``figure`` as an H×W×3 uint8 RGB array."""
    stream = io.BytesIO()
    figure.savefig(stream, format="png", dpi=TRACKER_DPI, bbox_inches="tight")
    stream.seek(0)
    with Image.open(stream) as image:
        return np.asarray(image.convert("RGB"))


def log_image(loggers: Sequence[Logger], key: str, image: np.ndarray, step: int) -> None:
    """Send ``image`` (H×W×3 uint8) as ``key`` at ``step`` to each logger that shows images.

    MLflow keeps it as the artifact ``<key>/step_<step>.png`` (zero-padded, so that the
    files sort in order); TensorBoard and W&B show it at ``step`` under ``key``.
    """
    for logger in image_loggers(loggers):
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(key, image, global_step=step, dataformats="HWC")
        elif isinstance(logger, MLFlowLogger):
            # run_id is set once experiment has created the run
            client = logger.experiment
            client.log_image(logger.run_id, image, artifact_file=f"{key}/step_{step:07d}.png")
        elif isinstance(logger, WandbLogger):
            logger.log_image(key=key, images=[image], step=step)
