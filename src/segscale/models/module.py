"""The LightningModule: normalization, the loss, metrics, optimizer."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassConfusionMatrix

from segscale.checks import ConfigError
from segscale.metrics import scores_from_confusion
from segscale.models.losses import SegmentationLoss
from segscale.training.optim import (
    Schedule,
    check_gradient_threshold,
    clip_gradients,
    lr_scheduler,
)

# Validation metrics are computed from torchmetrics states that are already gathered
# from every rank, so Lightning's hint to average them again with sync_dist is moot.
warnings.filterwarnings(
    "ignore", message=r".*sync_dist=True.*when logging on epoch level", module="lightning"
)

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]


def logs_this_step(trainer: L.Trainer) -> bool:
    """Whether the training step now running is one whose metrics are written or shown.

    As Lightning decides it, every ``log_every_n_steps`` optimizer steps (counted from
    1), and the first step (the verbose table's first row).
    """
    step = trainer.global_step
    return step == 0 or (step + 1) % max(1, trainer.log_every_n_steps) == 0


class SegmentationModule(L.LightningModule):
    """Trains a segmentation network with ``loss`` and measures it on validation.

    ``loss`` defaults to plain cross-entropy over the labelled pixels. ``mean`` and
    ``std`` are per channel, as fractions of ``max_value`` (the full intensity of the
    images' pixel type: 255 for 8-bit, 65535 for 16-bit). ``optimizer`` may be None for
    a module that only predicts (predict.py, evaluate.py).
    ``inference_metadata`` (what predict.py and evaluate.py need to rebuild the network
    without the training config: architecture, classes, normalization) is stored in
    every checkpoint under the ``segscale`` key.

    Validation metrics are torchmetrics states (a confusion matrix and a pixel-weighted
    mean loss) that Lightning syncs across ranks before they are computed, so a DDP run
    reports the metrics of the whole validation set, not an average of per-rank values.
    """

    def __init__(
        self,
        network: nn.Module,
        optimizer: OptimizerFactory | None,
        num_classes: int,
        class_names: Sequence[str],
        ignore_index: int = 255,
        mean: Sequence[float] = (0.485, 0.456, 0.406),
        std: Sequence[float] = (0.229, 0.224, 0.225),
        schedule: Schedule | None = None,
        gradient_threshold: float = math.inf,
        gradient_threshold_method: str = "l2norm",
        channels_last: bool = False,
        loss: SegmentationLoss | None = None,
        inference_metadata: dict[str, Any] | None = None,
        max_value: float = 255.0,
    ) -> None:
        super().__init__()
        check_gradient_threshold(gradient_threshold, gradient_threshold_method)
        self.network, self.optimizer_factory = network, optimizer
        self.schedule = schedule or Schedule("none")
        self.gradient_threshold = gradient_threshold
        self.gradient_threshold_method = gradient_threshold_method
        # channels_last (NHWC) lets cuDNN use tensor-core kernels for convolutions.
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.network.to(memory_format=self.memory_format)
        self.num_classes, self.class_names, self.ignore_index = (
            num_classes,
            tuple(class_names),
            ignore_index,
        )
        # mean and std are fractions of full intensity; images arrive in raw pixel values.
        mean, std = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)
        self.max_value = max_value
        self.register_buffer("mean", mean * max_value, persistent=False)
        self.register_buffer("std", std * max_value, persistent=False)
        self.loss_fn = loss if loss is not None else SegmentationLoss(num_classes, ignore_index)
        self.inference_metadata = inference_metadata
        self.val_confusion = MulticlassConfusionMatrix(num_classes, ignore_index=ignore_index)
        self.last_val_confusion: torch.Tensor | None = None  # of the latest validation
        self.val_loss = MeanMetric()

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """Class logits (N×K×H×W) of images (N×C×H×W) in raw pixel values (0 to max_value)."""
        # To the model's float type: float32, or float64 under trainer.precision=64-true.
        image = (image.to(self.mean.dtype) - self.mean) / self.std
        return self.network(image.contiguous(memory_format=self.memory_format))

    def _loss(self, logits: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # The batch's loss and its labelled pixels; a batch with none gives 0, not NaN.
        terms = self.loss_fn(logits, mask)
        return terms.mean(), terms.counts[1]

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """The loss of one batch; logs it, and the batch's pixel accuracy when logged.

        Under DDP the gradient of the pixel terms (cross-entropy, focal) must be that of
        the mean over the *global* batch's labelled pixels, also when the ranks' batches
        differ in size (uneven devices) or in labelled pixels (ignored borders). DDP
        averages the ranks' gradients, so each rank divides its pixel-loss sums by the
        global normalisers (one all-reduce of two numbers), times the world size. The Dice
        term is a per-batch quantity of each rank's batch, which DDP averages over the
        ranks: exact for the pixel terms, a mean of per-device Dice losses for Dice (as in
        every DDP framework).
        """
        logits = self(batch["image"])
        mask = batch["mask"].long()  # uint8 through the DataLoader, class indices here
        terms = self.loss_fn(logits, mask)
        global_counts = self.trainer.strategy.reduce(terms.counts.clone(), reduce_op="sum")
        objective = terms.mean(global_counts, scale=self.trainer.world_size)
        self.log("train/loss", terms.mean(), prog_bar=True)
        if logs_this_step(self.trainer):
            # Only when the metrics are written: the argmax over the logits is 3-4% of a
            # CPU step, and Lightning keeps one value per log_every_n_steps steps anyway.
            with torch.no_grad():
                labelled = mask != self.ignore_index
                correct = ((logits.argmax(1) == mask) & labelled).sum()
                self.log("train/acc", correct / labelled.sum().clamp(min=1))
        return objective

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Accumulate the confusion matrix and loss of one validation batch."""
        logits = self(batch["image"])
        mask = batch["mask"].long()
        loss, valid = self._loss(logits, mask)
        self.val_loss.update(loss, weight=valid)
        self.val_confusion.update(logits.argmax(1), mask)

    def on_validation_epoch_end(self) -> None:
        """Log validation loss, accuracy, mean IoU and per-class IoU over all ranks."""
        confusion = self.val_confusion.compute()
        self.last_val_confusion = confusion.cpu()
        scores = scores_from_confusion(confusion)
        # compute() has already gathered every rank's state, so these values are the
        # same on all ranks and need no further reduction.
        metrics = {
            "val/loss": self.val_loss.compute(),
            "val/acc": scores["acc"],
            "val/mIoU": scores["mIoU"],
        }
        for name, iou in zip(self.class_names, scores["iou"], strict=True):
            metrics[f"val/IoU_{name}"] = iou
        for key, value in metrics.items():
            self.log(key, value.float(), prog_bar=key == "val/mIoU")
        self.val_confusion.reset()
        self.val_loss.reset()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store ``inference_metadata`` in the checkpoint, for predict.py and evaluate.py."""
        if self.inference_metadata is not None:
            checkpoint["segscale"] = self.inference_metadata

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Clip the (already all-reduced, unscaled) gradients: MATLAB's GradientThreshold."""
        clip_gradients(
            list(self.network.parameters()), self.gradient_threshold, self.gradient_threshold_method
        )

    def configure_optimizers(self) -> dict[str, Any]:
        """The ``optimizer`` group's optimizer, its rate set per step by ``scheduler``."""
        optimizer = self.optimizer_factory(self.network)
        total_steps = self.trainer.estimated_stepping_batches
        if not math.isfinite(total_steps):
            raise ConfigError(
                "trainer.max_epochs=-1 with trainer.max_steps=-1 trains without end: the "
                "learning-rate schedule needs one; set trainer.max_steps or trainer.max_epochs"
            )
        if self.trainer.train_dataloader is None:  # max_epochs=-1: Lightning has not loaded it
            self.trainer.fit_loop.setup_data()
        batches = self.trainer.num_training_batches
        steps_per_epoch = max(1, math.ceil(batches / self.trainer.accumulate_grad_batches))
        scheduler = lr_scheduler(optimizer, self.schedule, steps_per_epoch, int(total_steps))
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
