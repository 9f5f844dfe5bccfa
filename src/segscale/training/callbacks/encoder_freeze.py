"""``training.freeze_encoder_epochs``: the encoder is not trained in the first epochs."""

from __future__ import annotations

import logging

import lightning as L
import torch
from torch import nn

from segscale.models.optim import encoder_of

log = logging.getLogger(__name__)

KEY = "training.freeze_encoder_epochs"


class EncoderFreeze(L.Callback):
    """Freezes the network's encoder for the first ``epochs`` epochs, then trains it.

    While frozen, the encoder's parameters are not updated and the encoder runs in eval
    mode: its batch norm normalizes with, and does not update, its running statistics
    (and dropout, if it has any, is off): it computes the features it was loaded with.

    The encoder's parameters keep ``requires_grad`` and their gradients are computed
    and, under DDP, all-reduced as usual; they are dropped (set to ``None``) just before
    each optimizer step. A parameter without a gradient is left alone by every torch
    optimizer: no update, no weight decay, and no momentum or Adam moments gathered
    that would move it once it thaws. This keeps DDP's set of reduced parameters fixed
    for the whole run, so no ``find_unused_parameters`` is needed, and a resumed run
    knows from its epoch alone whether the encoder is frozen. The price is the
    encoder's backward pass, computed while frozen and not used.
    """

    def __init__(self, epochs: int = 0) -> None:
        self.epochs = epochs
        self.frozen = False
        self._encoder: nn.Module | None = None
        self._parameters: list[nn.Parameter] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Find the encoder of the module's network (a ``ConfigError`` if it has none)."""
        if self.epochs and stage == "fit":
            self._encoder = encoder_of(getattr(pl_module, "network", pl_module), KEY, self.epochs)
            self._parameters = list(self._encoder.parameters())

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Freeze the encoder if training starts (or resumes) in a frozen epoch; log it."""
        if not self.epochs:
            return
        self._apply(trainer.current_epoch < self.epochs, training=pl_module.training)
        if trainer.is_global_zero:
            # Epochs as the verbose table counts them, from 1.
            state = (
                "is frozen (no updates, batch norm in eval mode)" if self.frozen else "was frozen"
            )
            log.info(
                "%s=%d: the encoder %s in epochs 1 to %d", KEY, self.epochs, state, self.epochs
            )

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Unfreeze the encoder at epoch ``epochs`` (counted from 0)."""
        if not self.frozen or trainer.current_epoch < self.epochs:
            return
        self._apply(False, training=pl_module.training)
        if trainer.is_global_zero:
            epoch = trainer.current_epoch + 1  # as the verbose table counts, from 1
            log.info("%s=%d: the encoder is unfrozen, from epoch %d on", KEY, self.epochs, epoch)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Drop the frozen encoder's gradients, so that the optimizer leaves it alone."""
        if self.frozen:
            # Plain attribute writes: no kernel, no host sync.
            for parameter in self._parameters:
                parameter.grad = None

    def _apply(self, frozen: bool, training: bool) -> None:
        """Put the encoder in eval mode (frozen) or in the module's mode (thawed)."""
        assert self._encoder is not None  # setup found it, since epochs > 0
        self.frozen = frozen
        # Lightning's validation loop restores every submodule's own mode afterwards, so
        # an encoder in eval mode stays in it through validation.
        self._encoder.train(training and not frozen)
