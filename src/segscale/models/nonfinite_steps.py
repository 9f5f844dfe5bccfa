"""A training module's guard against non-finite steps: stop the run, or skip the step.

``training.on_nonfinite`` (``segscale.models.nonfinite``) as Lightning hooks: each
optimizer step's verdict is computed on the device; under ``stop`` it is read one step
later, and before anything acts on the weights a non-finite step changed (validation, a
checkpoint, the end of training); under ``skip`` the step is refused at once, its
gradients dropped and its batch-norm statistics restored.
"""

from __future__ import annotations

import logging

import lightning as L
import torch
from torch import nn

from segscale.models.nonfinite import (
    NonFiniteError,
    PendingVerdict,
    any_nonfinite,
    describe,
    highest,
    highest_rate,
)

log = logging.getLogger(__name__)


class NonFiniteSteps(L.LightningModule):
    """The non-finite policy of a module whose network is ``self.network``.

    Subclasses set ``_nonfinite`` (this step's loss flag, on the device) in their
    training step, snapshot ``_buffers_before`` under ``skip``, and call ``guard_step``
    before each optimizer step.
    """

    network: nn.Module

    def __init__(self, on_nonfinite: str = "stop") -> None:
        super().__init__()
        self.on_nonfinite = on_nonfinite
        self.skipped_steps = 0
        self._nonfinite: torch.Tensor | None = None  # this step's loss verdict, on the device
        self._pending: PendingVerdict | None = None  # the last step's, read at the next
        self.stopped_at_step: int | None = None  # the non-finite step that stopped the run
        self._buffers_before: list[torch.Tensor] = []  # batch-norm statistics, under skip
        # The highest learning rate of the optimizer steps this process took: what the
        # message names, since the optimizer's rate when a verdict is read is the
        # schedule's next one (0 after the last step of poly).
        self._peak_rate: float | None = None

    def guard_step(
        self, parameters: list[nn.Parameter], optimizer: torch.optim.Optimizer | None
    ) -> bool:
        """Whether the optimizer step about to be taken may go ahead (then clip first).

        Raises ``NonFiniteError`` for the step before under ``stop``; refuses this one
        (``False``) under ``skip`` if its loss or a gradient is not finite. The verdict
        is computed on the device from the gradients as they are, before clipping (which
        would turn an infinite gradient into NaN weights, or clamp it into a finite one).
        Under ``stop`` it is read one step later (``_raise_if_pending``), so that the host
        never waits for the step it has just queued.
        """
        self._raise_if_pending()
        rate_before = self._peak_rate  # of the steps that made the weights this one starts from
        try:
            if self._nonfinite is not None:
                verdict = self._step_verdict(parameters)
                if self.on_nonfinite == "skip":
                    loss, gradient = verdict.tolist()  # the host must know now, to skip
                    if loss or gradient:
                        self._refuse_step("loss" if loss else "gradient", parameters)
                        return False
                else:
                    step = self.trainer.global_step
                    self._pending = PendingVerdict.of(verdict, step, rate_before)
        finally:
            # the next step starts afresh
            self._nonfinite = None
            self._buffers_before = []
        self._note_rate(optimizer)
        return True

    def _note_rate(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Count the rate of the step ``optimizer`` is about to take into ``_peak_rate``."""
        if optimizer is None:
            return
        rates = (self._peak_rate, highest_rate([optimizer]))
        self._peak_rate = highest([rate for rate in rates if rate is not None])

    def _step_verdict(self, parameters: list[nn.Parameter]) -> torch.Tensor:
        """Two flags on the device: the loss, and any gradient, is not finite.

        Under 16-mixed the gradient scaler already skips steps with non-finite gradients
        (that is how it finds its scale), so only the loss counts there.
        """
        loss = self._nonfinite
        assert loss is not None  # on_before_optimizer_step calls this only with a verdict
        gradient = torch.zeros_like(loss)
        if self.trainer.precision != "16-mixed":
            gradients = [p.grad for p in parameters if p.grad is not None]
            if gradients:
                gradient = any_nonfinite(gradients).to(loss.device)
        return torch.stack([loss, gradient])

    def _raise_if_pending(self) -> None:
        """Raise ``NonFiniteError`` if the step before this one was not finite (``stop``).

        Called at the next optimizer step, before validation, before a checkpoint is
        written and when training ends, so that weights a non-finite step changed are
        never validated, saved or reported. The one host read per step, of a flag the
        device computed a whole step ago (tests/training/test_host_syncs.py counts it).
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        loss, gradient = pending.read()
        if loss or gradient:
            self.stopped_at_step = pending.step
            what = "loss" if loss else "gradient"
            message = self._describe_nonfinite(what, pending.step, pending.learning_rate)
            raise NonFiniteError(f"training stopped: {message}")

    def on_train_start(self) -> None:
        """A resumed run's rate at the resume stands for its earlier launches' steps.

        Only this process's steps are noted (``_note_rate``); a checkpoint keeps no rates.
        """
        if self.trainer.global_step > 0:
            self._peak_rate = highest_rate(self.trainer.optimizers)

    def on_validation_start(self) -> None:
        """Validate no weights that a non-finite step changed (``_raise_if_pending``)."""
        self._raise_if_pending()

    def on_train_epoch_end(self) -> None:
        """Let no callback act on weights a non-finite step changed (``_raise_if_pending``).

        Lightning calls the callbacks' ``on_train_end`` before the module's: without a
        validation or checkpoint after the last steps (an integer ``val_check_interval``,
        ``check_val_every_n_epoch`` > 1), the report would predict its samples with them.
        An epoch's end comes after its last step, before any ``on_train_end``.
        """
        self._raise_if_pending()

    def on_train_end(self) -> None:
        """Report no weights that the last step left non-finite (``_raise_if_pending``)."""
        self._raise_if_pending()

    def _refuse_step(self, what: str, parameters: list[nn.Parameter]) -> None:
        """Make this step, whose ``what`` is not finite, change nothing (``skip``)."""
        message = self._describe_nonfinite(what, self.trainer.global_step, self._peak_rate)
        # An optimizer leaves parameters without a gradient untouched (no momentum, no
        # weight decay); the batch-norm statistics go back to before the forward pass.
        for parameter in parameters:
            parameter.grad = None
        for buffer, before in zip(self.network.buffers(), self._buffers_before, strict=True):
            buffer.copy_(before)
        self.skipped_steps += 1
        if self.trainer.is_global_zero:
            log.warning("skipped a step (training.on_nonfinite=skip): %s", message)

    def _describe_nonfinite(
        self, what: str, step: int | None = None, rate_before: float | None = None
    ) -> str:
        """``describe`` for ``step`` (default: after every step so far, a validation's).

        ``rate_before``: the highest rate of the steps before ``step`` (default: of
        every step so far; ``None``: none changed the weights).
        """
        if step is None:
            step, rate_before = self.trainer.global_step, self._peak_rate
        return describe(
            what,
            step,
            self.trainer.current_epoch,
            rate_before,
            str(self.trainer.precision),
        )
