"""The evaluation report of the final network on the validation set."""

from __future__ import annotations

import logging
import math
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.hooks import RemovableHandle

from segscale.data.classes.labels import class_colours
from segscale.data.sampling.patches import GridPatchDataset
from segscale.data.storage.sources import display_rgb
from segscale.runs.evaluation import write_evaluation
from segscale.training.reporting.plots import (
    BackgroundFigures,
    SamplePrediction,
    image_loggers,
    log_image,
    plot_sample_predictions,
    render,
    sample_predictions_figure,
)
from segscale.training.reporting.scored_validations import ScoredValidations
from segscale.training.reporting.whole_tile_prediction import (
    display_stride,
    paste_window,
    predict_whole_tile,
    tile_canvas,
    tile_windows,
)

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
    ranks) at the validation of the network the run hands over (``network``: the best
    validation's, ``best.ckpt``, or the last one's; ``metrics.json`` names it); and
    ``sample_predictions.png``: up to ``num_samples`` whole validation images (spread
    evenly over the validation set), their ground truth and the final network's
    prediction, each pixel predicted by the validation-grid patch that scores it
    (``whole_tile_prediction``), images larger than ``MAX_SAMPLE_SIDE`` shown
    subsampled. Rank 0 writes it all; it holds every validation tile (each rank only
    validates its share).

    The samples' predictions are the ones the last validation made (``SampleCapture``)
    when it validated the final network on one process; otherwise (a multi-device run,
    training past the last validation) the samples are predicted again. The report of
    the final validation of such a run is written as that validation ends, before the
    checkpoints after it; the figures are drawn in the background
    (``BackgroundFigures``), waited for when fitting ends.

    At the end of every validation (not the sanity check), rank 0 also sends the
    trackers that show images (TensorBoard, MLflow, W&B; ``log_image``) one
    figure of ``tracker_samples`` validation images (the same ones each time, spread
    evenly over the validation set), their ground truth and the network's prediction,
    as ``val/samples``; 0 sends none. The predictions are the validation's own where
    it kept them, else the tiles are predicted again.
    """

    def __init__(
        self,
        folder: str,
        num_samples: int = 4,
        tracker_samples: int = 4,
        network: str = "best-validation",
    ) -> None:
        self.folder = Path(folder)
        self.num_samples = num_samples
        self.tracker_samples = tracker_samples
        # The report scores the network the run hands over: best.ckpt's validation, or
        # the last one (``network``: training.output_network).
        self.scores = ScoredValidations(network, "callbacks.validation_report.network")
        self.validated_at: int | None = None  # iteration of the last validation
        self.figures = BackgroundFigures("evaluation-figures")
        self._capture: SampleCapture | None = None  # of the validation now running
        self._captured: SampleCapture | None = None  # of the last validation, if whole
        self._hook: RemovableHandle | None = None
        self.reported_at: int | None = None  # the iteration the report on disk was made at

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Keep the sample tiles' predictions as this validation makes them (one process)."""
        grid = getattr(trainer.datamodule, "val_set", None)  # type: ignore[attr-defined]
        if trainer.sanity_checking or trainer.world_size > 1 or not trainer.is_global_zero:
            return
        if not isinstance(grid, GridPatchDataset) or not grid.tiles:
            return
        wanted = {*_sample_tiles(grid, self.num_samples), *self._tracker_tiles(trainer, grid)}
        if wanted:
            self._capture = SampleCapture(grid, sorted(wanted))
            self._hook = pl_module.register_forward_hook(self._capture.forward_hook)

    def on_validation_batch_start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Tell the capture which grid patches this batch holds."""
        if self._capture is not None:
            batch_size = int(getattr(trainer.datamodule, "val_batch_size", 1))  # type: ignore[attr-defined]
            self._capture.first_index = batch_idx * batch_size

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Note the iteration the module's confusion matrix now belongs to."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if not trainer.sanity_checking:  # a sanity check's few batches are no report
            self.validated_at = trainer.global_step
            self._record(trainer, pl_module)
            capture, self._capture = self._capture, None
            self._captured = capture if capture is not None and capture.complete() else None
            if trainer.is_global_zero:
                self._log_samples(trainer, pl_module)
            if self._captured is not None and _is_last_step(trainer):
                # The final validation: report now, while the checkpoints after it are
                # written, rather than after them.
                self._report(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Wait until the figures are written."""
        self.figures.close()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Finish the figures asked for before the run stopped."""
        self.figures.close()

    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the report (rank 0 only), unless the final validation wrote it."""
        if self.reported_at is None or self.reported_at != trainer.global_step:
            self._report(trainer, pl_module)

    def state_dict(self) -> dict[str, Any]:
        """The validations so far, so that a resumed run can still report best.ckpt's."""
        return self.scores.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the validations of the run a resume continues."""
        self.scores.load_state_dict(state_dict)

    def _record(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Keep this validation's confusion matrix and the score best.ckpt is chosen by."""
        confusion = getattr(pl_module, "last_val_confusion", None)
        monitor = getattr(trainer.checkpoint_callback, "monitor", None)
        value = trainer.callback_metrics.get(monitor) if monitor else None
        if confusion is not None:
            score = None if value is None else float(value)
            self.scores.record(trainer.global_step, trainer.current_epoch, score, confusion)

    def _report(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.reported_at = trainer.global_step
        mode = getattr(trainer.checkpoint_callback, "mode", "max")
        scored, checkpoint = self.scores.handed_over(mode, trainer.global_step)
        if scored is None or self.validated_at is None:
            log.warning("no validation ran, so there is no evaluation report")
            return
        # Only a SegmentationModule has a validation confusion matrix.
        module = cast("SegmentationModule", pl_module)
        title = f"Validation confusion matrix at iteration {scored.step}"
        # How validation predicted (its patch grid): evaluate.py's default, to compare with.
        inference = (module.inference_metadata or {}).get("validation_inference")
        # The network the run hands over (training.output_network), as that validation
        # scored it (with training.ema, the average: what the checkpoint holds).
        network: dict[str, object] = {
            "checkpoint": checkpoint,
            "epoch": scored.epoch,
            "step": scored.step,
        }
        write_evaluation(
            self.folder,
            scored.confusion,
            list(module.class_names),
            title,
            self.figures,
            inference,
            network=network,
        )
        self._plot_samples(trainer, module)

    def _tracker_tiles(self, trainer: L.Trainer, grid: GridPatchDataset) -> list[int]:
        """The tiles shown to the trackers at each validation (none if no tracker shows them)."""
        if not image_loggers(trainer.loggers):
            return []
        return _sample_tiles(grid, self.tracker_samples)

    def _log_samples(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Send this validation's sample predictions to the trackers that show images."""
        grid = getattr(trainer.datamodule, "val_set", None)  # type: ignore[attr-defined]
        if not isinstance(grid, GridPatchDataset) or not self._tracker_tiles(trainer, grid):
            return
        module = cast("SegmentationModule", pl_module)
        samples = self._samples(trainer, module, self._tracker_tiles(trainer, grid))
        title = f"Validation at iteration {trainer.global_step}"
        figure = sample_predictions_figure(samples, *self._legend(trainer, module), title)
        log_image(trainer.loggers, "val/samples", render(figure), trainer.global_step)

    def _samples(
        self, trainer: L.Trainer, module: SegmentationModule, picks: list[int]
    ) -> list[SamplePrediction]:
        """The validation tiles ``picks``, their truth and this network's predictions."""
        # Lightning's DataConnector sets trainer.datamodule; Trainer does not declare it.
        datamodule = trainer.datamodule  # type: ignore[attr-defined]
        grid = datamodule.val_set
        names = _tile_names(datamodule)
        captured = self._captured if self.validated_at == trainer.global_step else None
        if captured is not None:  # the last validation predicted them with this network
            predictions = [captured.canvases[t] for t in picks]
        else:
            batch_size = int(getattr(datamodule, "val_batch_size", 8))
            predictions = self._predict(module, grid, picks, batch_size)
        return [
            self._sample(module, grid, t, p, names) for t, p in zip(picks, predictions, strict=True)
        ]

    @staticmethod
    def _legend(trainer: L.Trainer, module: SegmentationModule) -> tuple[Any, np.ndarray, int]:
        """The class names, their colours and the ignore index of the sample figures."""
        classes = module.class_names
        colours = class_colours(
            getattr(trainer.datamodule, "class_colors", None),  # type: ignore[attr-defined]
            len(classes),
        )
        return classes, colours[: len(classes)], module.ignore_index

    def _plot_samples(self, trainer: L.Trainer, module: SegmentationModule) -> None:
        grid = getattr(trainer.datamodule, "val_set", None)  # type: ignore[attr-defined]
        if not isinstance(grid, GridPatchDataset) or not grid.tiles or self.num_samples < 1:
            return
        samples = self._samples(trainer, module, _sample_tiles(grid, self.num_samples))
        path = self.folder / "sample_predictions.png"
        title = f"Final network (iteration {trainer.global_step}) on whole validation images"
        self.figures.draw(
            path,
            partial(plot_sample_predictions, samples, *self._legend(trainer, module), path, title),
        )

    @staticmethod
    def _predict(
        module: SegmentationModule, grid: GridPatchDataset, tiles: list[int], batch_size: int
    ) -> list[np.ndarray]:
        """The classes the final network gives the sample tiles, predicted again."""

        def classify(images: torch.Tensor) -> torch.Tensor:
            return module(images.to(module.device)).argmax(1)

        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                return [
                    predict_whole_tile(classify, grid, t, _stride(grid, t), batch_size)
                    for t in tiles
                ]
        finally:
            module.train(was_training)

    @staticmethod
    def _sample(
        module: SegmentationModule,
        grid: GridPatchDataset,
        tile: int,
        prediction: np.ndarray,
        names: list[str],
    ) -> SamplePrediction:
        """Tile ``tile`` of the validation set, its ground truth and its prediction."""
        shape = grid.tiles[tile].shape
        stride = _stride(grid, tile)
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


class SampleCapture:
    """The sample tiles' predictions, pasted from the validation's own forward passes.

    ``forward_hook`` sees the logits of each validation batch; ``first_index`` is the
    grid index of the batch's first patch (one process validates the grid in order).
    """

    def __init__(self, grid: GridPatchDataset, tiles: list[int]) -> None:
        self.grid = grid
        self.canvases = {t: tile_canvas(grid, t, _stride(grid, t)) for t in tiles}
        self._tile_of = {i: t for t in tiles for i in tile_windows(grid, t)}
        self._missing = set(self._tile_of)
        self.first_index = 0

    def forward_hook(self, module: Any, inputs: Any, logits: torch.Tensor) -> None:
        """Paste the batch's patches of sample tiles into their tiles' canvases."""
        indices = range(self.first_index, self.first_index + logits.shape[0])
        rows = [row for row, index in enumerate(indices) if index in self._tile_of]
        if not rows:
            return
        classes = logits[rows].argmax(1).cpu().numpy()  # only these batches wait for it
        for row, patch in zip(rows, classes, strict=True):
            index = indices[row]
            tile = self._tile_of[index]
            paste_window(self.canvases[tile], self.grid, index, patch, _stride(self.grid, tile))
            self._missing.discard(index)

    def complete(self) -> bool:
        """Whether every patch of the sample tiles was predicted (no limit_val_batches)."""
        return not self._missing


def _is_last_step(trainer: L.Trainer) -> bool:
    """Whether the trainer has taken every optimizer step it plans (training ends now)."""
    planned = trainer.estimated_stepping_batches
    return math.isfinite(planned) and trainer.global_step >= planned


def _sample_tiles(grid: GridPatchDataset, count: int) -> list[int]:
    """Up to ``count`` tiles, spread evenly over the validation set (none for 0)."""
    count = max(0, min(count, len(grid.tiles)))
    return [int(t) for t in np.linspace(0, len(grid.tiles) - 1, count).round().astype(int)]


def _stride(grid: GridPatchDataset, tile: int) -> int:
    return display_stride(grid.tiles[tile].shape, MAX_SAMPLE_SIDE)


def _tile_names(datamodule: Any) -> list[str]:
    """The validation images' file names, in the grid's tile order (if the data has them)."""
    report = getattr(datamodule, "report", None)
    pairs = getattr(report, "pairs", {}).get("val", []) if report is not None else []
    return [pair.image.name for pair in pairs]
