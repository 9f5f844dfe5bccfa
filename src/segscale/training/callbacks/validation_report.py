"""The evaluation report of the final network on the validation set."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_only

from segscale.data.labels import class_colours
from segscale.data.patches import GridPatchDataset
from segscale.data.sources import display_rgb
from segscale.training.evaluation import write_evaluation
from segscale.training.plots import SamplePrediction, plot_sample_predictions
from segscale.training.whole_tile_prediction import display_stride, predict_whole_tile

if TYPE_CHECKING:
    from segscale.models.module import SegmentationModule

log = logging.getLogger(__name__)

MAX_SAMPLE_SIDE = 1024
"""A sample larger than this (pixels, long side) is shown subsampled to fit."""


class ValidationReport(L.Callback):
    """At the end of training, MATLAB's ``evaluateSemanticSegmentation`` on validation.

    Writes into ``folder``: ``metrics.json`` (global and mean accuracy, mean and
    weighted IoU, mean Dice, and per class accuracy, IoU and Dice),
    ``class_metrics.csv``, ``confusion_matrix.csv`` (rows: true class, columns:
    predicted) and ``confusion_matrix.png``, computed over the whole validation set (all
    ranks) at the last validation; and ``sample_predictions.png``: up to
    ``num_samples`` whole validation images (spread evenly over the validation set),
    their ground truth and the final network's prediction, each pixel predicted by the
    validation-grid patch that scores it (``whole_tile_prediction``), images larger
    than ``MAX_SAMPLE_SIDE`` shown subsampled. Rank 0 writes it all; it holds every
    validation tile (each rank only validates its share).
    """

    def __init__(self, folder: str, num_samples: int = 4) -> None:
        self.folder, self.num_samples = Path(folder), num_samples
        self.validated_at: int | None = None  # iteration of the last validation

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Note the iteration the module's confusion matrix now belongs to."""
        if not trainer.sanity_checking:  # a sanity check's few batches are no report
            self.validated_at = trainer.global_step

    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the report (rank 0 only)."""
        confusion = getattr(pl_module, "last_val_confusion", None)
        if confusion is None or self.validated_at is None:
            log.warning("no validation ran, so there is no evaluation report")
            return
        # Only a SegmentationModule has a validation confusion matrix.
        module = cast("SegmentationModule", pl_module)
        title = f"Validation confusion matrix at iteration {self.validated_at}"
        write_evaluation(self.folder, confusion, list(module.class_names), title)
        self._plot_samples(trainer, module)

    def _plot_samples(self, trainer: L.Trainer, module: SegmentationModule) -> None:
        # Lightning's DataConnector sets trainer.datamodule; Trainer does not declare it.
        datamodule = trainer.datamodule  # type: ignore[attr-defined]
        grid = getattr(datamodule, "val_set", None)
        if not isinstance(grid, GridPatchDataset) or not grid.tiles or self.num_samples < 1:
            return
        count = min(self.num_samples, len(grid.tiles))
        picks = np.linspace(0, len(grid.tiles) - 1, count).round().astype(int)
        batch_size = int(getattr(datamodule, "val_batch_size", 8))
        was_training = module.training
        module.eval()
        names = _tile_names(datamodule)
        try:
            with torch.no_grad():
                samples = [self._sample(module, grid, int(t), batch_size, names) for t in picks]
        finally:
            module.train(was_training)
        classes = module.class_names
        colours = class_colours(getattr(datamodule, "class_colors", None), len(classes))
        plot_sample_predictions(
            samples,
            classes,
            colours[: len(classes)],
            module.ignore_index,
            self.folder / "sample_predictions.png",
            f"Final network (iteration {trainer.global_step}) on whole validation images",
        )

    def _sample(
        self,
        module: SegmentationModule,
        grid: GridPatchDataset,
        tile: int,
        batch_size: int,
        names: list[str],
    ) -> SamplePrediction:
        """Tile ``tile`` of the validation set, its ground truth and its prediction."""
        shape = grid.tiles[tile].shape
        stride = display_stride(shape, MAX_SAMPLE_SIDE)

        def classify(images: torch.Tensor) -> torch.Tensor:
            return module(images.to(module.device)).argmax(1)

        prediction = predict_whole_tile(classify, grid, tile, stride, batch_size)
        image, mask = grid.tiles[tile].image, grid.tiles[tile].mask
        name = names[tile] if tile < len(names) else f"image {tile + 1}"
        scale = f", shown at 1/{stride} scale" if stride > 1 else ""
        return SamplePrediction(
            display_rgb(np.asarray(image[::stride, ::stride]), module.max_value),
            np.asarray(mask[::stride, ::stride]),
            prediction,
            f"validation image {tile + 1} of {len(grid.tiles)}: {name}, "
            f"{shape[1]}×{shape[0]} px{scale}",
        )


def _tile_names(datamodule: Any) -> list[str]:
    """The validation images' file names, in the grid's tile order (if the data has them)."""
    report = getattr(datamodule, "report", None)
    pairs = getattr(report, "pairs", {}).get("val", []) if report is not None else []
    return [pair.image.name for pair in pairs]
