"""The LightningModule: normalization, the loss, metrics, optimizer."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassConfusionMatrix

from segscale.errors import ConfigError
from segscale.models.checkpoint.reading import read_trained_network
from segscale.models.checkpoint.record import CheckpointRecord
from segscale.models.losses import SegmentationLoss
from segscale.models.metrics import scores_from_confusion
from segscale.models.nonfinite import NonFiniteError
from segscale.models.nonfinite_steps import NonFiniteSteps
from segscale.models.optim import (
    Schedule,
    clip_gradients,
    lr_scheduler,
)

# Validation metrics are computed from torchmetrics states that are already gathered
# from every rank, so Lightning's hint to average them again with sync_dist is moot.
warnings.filterwarnings(
    "ignore", message=r".*sync_dist=True.*when logging on epoch level", module="lightning"
)

log = logging.getLogger(__name__)

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]


def logs_this_step(trainer: L.Trainer) -> bool:
    """Whether the training step now running is one whose metrics are written or shown.

    As Lightning decides it, every ``log_every_n_steps`` optimizer steps (counted from
    1), and the first step (the verbose table's first row).
    """
    step = trainer.global_step
    # Lightning's LoggerConnector sets it on the trainer; Trainer does not declare it.
    every = trainer.log_every_n_steps  # type: ignore[attr-defined]
    return step == 0 or (step + 1) % max(1, every) == 0


def log_part_rates(optimizer: torch.optim.Optimizer) -> None:
    """Log the encoder's and the decoder's learning rates, if the optimizer sets them apart.

    ``build_optimizer`` names the groups of each part under ``training.encoder_lr_factor``.
    """
    groups = optimizer.param_groups
    encoder = next((g for g in groups if str(g.get("name", "")).startswith("encoder")), None)
    if encoder is not None:
        log.info(
            "training.encoder_lr_factor=%g: the encoder learns at %g, the decoder and head at %g",
            encoder["lr_factor"],
            encoder["lr"],
            groups[0]["lr"],  # the decoder's, always first
        )


class SegmentationModule(NonFiniteSteps):
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

    mean: torch.Tensor  # buffers: per channel (1×C×1×1), in raw pixel values
    std: torch.Tensor

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
        on_nonfinite: str = "stop",
    ) -> None:
        super().__init__(on_nonfinite)
        self.network = network
        self.optimizer_factory = optimizer
        self.schedule = schedule or Schedule("none")
        self.gradient_threshold = gradient_threshold
        self.gradient_threshold_method = gradient_threshold_method
        # channels_last (NHWC) lets cuDNN use tensor-core kernels for convolutions.
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.network.to(memory_format=self.memory_format)
        self.num_classes = num_classes
        self.class_names = tuple(class_names)
        self.ignore_index = ignore_index
        # mean and std are fractions of full intensity; images arrive in raw pixel values.
        mean_t = torch.tensor(mean).view(1, -1, 1, 1)
        std_t = torch.tensor(std).view(1, -1, 1, 1)
        self.max_value = max_value
        self.register_buffer("mean", mean_t * max_value, persistent=False)
        self.register_buffer("std", std_t * max_value, persistent=False)
        self.loss_fn = loss if loss is not None else SegmentationLoss(num_classes, ignore_index)
        self.inference_metadata = inference_metadata
        self.val_confusion = MulticlassConfusionMatrix(num_classes, ignore_index=ignore_index)
        self.last_val_confusion: torch.Tensor | None = None  # of the latest validation
        self.val_loss = MeanMetric()

    @classmethod
    def load_from_checkpoint(  # type: ignore[override]
        cls,
        checkpoint_path: str | Path,
        map_location: Any = None,
        key: str = "checkpoint_path",
        **kwargs: Any,
    ) -> SegmentationModule:
        """The trained network of a ``train.py`` checkpoint, ready for inference on the CPU.

        Lightning's own ``load_from_checkpoint`` would unpickle the file and rebuild the
        module from saved hyperparameters; the network here is an object, so it is
        rebuilt from the checkpoint's record instead, the file read weights-only and
        verified against its digest (``segscale.models.checkpoint.reading``).
        ``map_location`` moves the module (``"cuda"``, a ``torch.device``); ``key``
        names what gave the path in error messages; ``kwargs`` is refused, as there are
        no hyperparameters to override.
        """
        if kwargs:
            raise TypeError(
                f"unexpected arguments {sorted(kwargs)}: a segscale checkpoint "
                "carries its network, classes and normalization itself"
            )
        module = cls.for_inference(*read_trained_network(checkpoint_path, key))
        return module.to(map_location) if map_location is not None else module

    @classmethod
    def for_inference(cls, network: nn.Module, record: CheckpointRecord) -> SegmentationModule:
        """A module that only predicts, around a checkpoint's ``network`` and its ``record``."""
        return cls(
            network=network,
            optimizer=None,
            num_classes=len(record.class_names),
            class_names=record.class_names,
            ignore_index=record.ignore_index,
            mean=record.mean,
            std=record.std,
            max_value=record.max_value,
            inference_metadata=record.stored,
        )

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
        previous = self._nonfinite
        first_micro_batch = previous is None  # of this optimizer step
        if first_micro_batch and self.on_nonfinite == "skip":  # a skipped step keeps them too
            self._buffers_before = [b.clone() for b in self.network.buffers()]
        logits = self(batch["image"])
        mask = batch["mask"].long()  # uint8 through the DataLoader, class indices here
        terms = self.loss_fn(logits, mask)
        loss = terms.mean()
        # The normalisers' all-reduce also carries whether any rank's loss is non-finite,
        # so every rank decides alike with no collective of its own.
        flag = (~torch.isfinite(loss)).to(terms.counts.dtype).reshape(1)
        reduced = self._sum_over_ranks(torch.cat([terms.counts, flag]))
        global_counts, nonfinite = reduced[:-1], reduced[-1] > 0
        # Under gradient accumulation every micro-batch of the step counts.
        self._nonfinite = nonfinite if previous is None else previous | nonfinite
        objective = terms.mean(global_counts, scale=self.trainer.world_size)
        if logs_this_step(self.trainer):
            # Only when the metrics are written (Lightning keeps one value per
            # log_every_n_steps steps anyway): each self.log costs ~0.25 ms of host time in
            # Lightning's result collection, and the argmax over the logits 3-4% of a CPU
            # step. Not in the progress bar: Lightning converts progress-bar values to
            # numbers after every step, a host sync each.
            self.log("train/loss", loss)
            with torch.no_grad():
                labelled = mask != self.ignore_index
                correct = ((logits.argmax(1) == mask) & labelled).sum()
                self.log("train/acc", correct / labelled.sum().clamp(min=1))
        return objective

    def _sum_over_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the ranks, in place under DDP.

        ``torch.distributed.all_reduce`` itself, not Lightning's ``strategy.reduce``: that
        one puts a barrier before the all-reduce, and a barrier makes the host wait for
        the device (NCCL); the all-reduce alone is queued on the device like any kernel.
        """
        if dist.is_available() and dist.is_initialized() and self.trainer.world_size > 1:
            dist.all_reduce(tensor)
            return tensor
        return self.trainer.strategy.reduce(tensor, reduce_op="sum")

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
        val_loss = self.val_loss.compute()
        if not self.trainer.sanity_checking and not bool(torch.isfinite(val_loss)):
            raise NonFiniteError(f"training stopped: {self._describe_nonfinite('validation loss')}")
        metrics = {
            "val/loss": val_loss,
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
        """Store ``inference_metadata`` (for predict.py and evaluate.py) and the skip count.

        Refuses (``_raise_if_pending``) to save weights that a non-finite step changed.
        """
        self._raise_if_pending()
        if self.inference_metadata is not None:
            checkpoint["segscale"] = self.inference_metadata
        checkpoint["segscale_skipped_steps"] = self.skipped_steps

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Continue the resumed run's count of skipped steps, in the run's precision.

        Lightning loads a resumed run's weights before its precision plugin converts
        the network, so float64 weights would pass through float32 and a
        ``trainer.precision=64-true`` run would not continue exactly: the network is
        made float64 first.
        """
        self.skipped_steps = int(checkpoint.get("segscale_skipped_steps", 0))
        if self._trainer is not None and str(self._trainer.precision).startswith("64"):
            self.double()

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Stop or skip a non-finite step (``guard_step``); clip the gradients.

        Clipping is MATLAB's GradientThreshold; the gradients here are all-reduced (the
        same on every rank) and unscaled.
        """
        parameters = list(self.network.parameters())
        if self.guard_step(parameters, optimizer):
            clip_gradients(parameters, self.gradient_threshold, self.gradient_threshold_method)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        """The ``optimizer`` group's optimizer, its rate set per step by ``scheduler``."""
        if self.optimizer_factory is None:  # calling None would raise this TypeError too
            raise TypeError("this module was built with optimizer=None: it cannot train")
        optimizer = self.optimizer_factory(self.network)
        if self.trainer.is_global_zero:
            log_part_rates(optimizer)
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
