"""The evaluation report of the final network on the validation set."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, cast

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_only

from segscale.data.labels import class_colours
from segscale.data.sources import display_rgb
from segscale.training.evaluation import write_evaluation
from segscale.training.plots import plot_sample_predictions

if TYPE_CHECKING:
    from segscale.models.module import SegmentationModule

log = logging.getLogger(__name__)


class ValidationReport(L.Callback):
    """At the end of training, MATLAB's ``evaluateSemanticSegmentation`` on validation.

    Writes into ``folder``: ``metrics.json`` (global and mean accuracy, mean and
    weighted IoU, mean Dice, and per class accuracy, IoU and Dice),
    ``class_metrics.csv``, ``confusion_matrix.csv`` (rows: true class, columns:
    predicted) and ``confusion_matrix.png``, computed over the whole validation set (all
    ranks) at the last validation; and ``sample_predictions.png`` with ``num_samples``
    validation patches, their ground truth and the final network's prediction.
    """

    def __init__(self, folder: str, num_samples: int = 4) -> None:
        self.folder, self.num_samples = Path(folder), num_samples

    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the report (rank 0 only)."""
        confusion = getattr(pl_module, "last_val_confusion", None)
        if confusion is None:
            log.warning("no validation ran, so there is no evaluation report")
            return
        # Only a SegmentationModule has a validation confusion matrix.
        module = cast("SegmentationModule", pl_module)
        write_evaluation(self.folder, confusion, list(module.class_names))
        self._plot_samples(trainer, module)

    def _plot_samples(self, trainer: L.Trainer, pl_module: SegmentationModule) -> None:
        # Lightning's DataConnector sets trainer.datamodule; Trainer does not declare it.
        datamodule = trainer.datamodule  # type: ignore[attr-defined]
        dataset = getattr(datamodule, "val_set", None)
        if not dataset or not self.num_samples:
            return
        count = min(self.num_samples, len(dataset))
        picks = [dataset[i] for i in np.linspace(0, len(dataset) - 1, count).round().astype(int)]
        images = torch.stack([p["image"] for p in picks]).to(pl_module.device)
        was_training = pl_module.training
        pl_module.eval()
        with torch.no_grad():
            predictions = pl_module(images).argmax(1).cpu().numpy()
        pl_module.train(was_training)
        names = pl_module.class_names
        colours = class_colours(getattr(datamodule, "class_colors", None), len(names))
        plot_sample_predictions(
            [display_rgb(p["image"].permute(1, 2, 0).numpy(), pl_module.max_value) for p in picks],
            [p["mask"].numpy().astype(np.uint8) for p in picks],
            predictions.astype(np.uint8),
            pl_module.class_names,
            colours[: len(pl_module.class_names)],
            pl_module.ignore_index,
            self.folder / "sample_predictions.png",
        )
