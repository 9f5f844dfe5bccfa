"""A preemption signal stops every rank at the same safe point; rank 0 saves a checkpoint.

The safe points are the ends of optimizer steps and of validation batches. A stop in a
validation abandons it: the checkpoint holds the training state of the last finished
step, marked so that Lightning runs that validation again, whole, when the run resumes
(a validation's metrics are not part of a checkpoint, so a partial one cannot continue).
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint

from segscale.training.ranks.preemption import Phase, Preempted, PreemptionSignals

log = logging.getLogger(__name__)


class PreemptionStop(L.Callback):
    """Stops every rank at the same safe point once any rank noted a signal; rank 0 saves.

    The checkpoint is ``<output_dir>/checkpoints/last.ckpt``, the file
    ``ckpt_path=auto`` resumes from (the newest one). Then every rank raises
    ``Preempted`` (after a training step, once Lightning has logged it), which the
    entry point turns into ``EXIT_PREEMPTED``. It also moves the run's ``signals``
    through their phases: training from the first step, finishing after the last.
    """

    def __init__(self, signals: PreemptionSignals, output_dir: str) -> None:
        self.signals = signals
        self.path = Path(output_dir) / "checkpoints" / "last.ckpt"
        self._group: Any = None
        self._flag = np.zeros(1, dtype=np.int64)
        self._pending: Any = None
        self._stop: Preempted | None = None
        self._agreed_val_batches = 0  # of this validation, the same on every rank
        self._saving_in_validation = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Open the CPU group the ranks agree through (every rank calls this); training starts."""
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")
        self.signals.enter(Phase.TRAINING)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """After a step: stop here if the ranks agreed that a signal came."""
        # Only between optimizer steps: a checkpoint inside a gradient-accumulation
        # window loses the window's gradients, and Lightning resumes after its batches.
        if not _steps_optimizer(trainer, batch_idx):
            return
        number = self._agreed()
        if not number:
            return
        self._stop = self._save(trainer, number, "")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Stop before the validation; else agree on how many of its batches can stop it.

        Ranks may hold one validation batch more or fewer than each other (the grid is
        split tile by tile), and the ranks agree at each safe point through a
        collective: only the batches every rank has are safe points.
        """
        self._raise_if_stopped()
        if trainer.sanity_checking:
            return
        batches = sum(int(b) for b in trainer.num_val_batches if b != float("inf"))
        if self._group is not None:
            count = torch.tensor([batches], dtype=torch.int64)
            dist.all_reduce(count, op=dist.ReduceOp.MIN, group=self._group)
            batches = int(count.numpy()[0])
        self._agreed_val_batches = batches

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """After a validation batch: stop here, abandoning the validation, if the ranks agreed."""
        if trainer.sanity_checking or batch_idx >= self._agreed_val_batches:
            return
        number = self._agreed()
        if not number:
            return
        self._saving_in_validation = True
        try:
            stop = self._save(trainer, number, f", abandoning its validation at batch {batch_idx}")
        finally:
            self._saving_in_validation = False
        raise stop

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """A stop in a validation: mark that validation as not run, so a resume runs it whole."""
        if self._saving_in_validation:
            rerun_validation(checkpoint)

    # The stop is raised at the next hook, after Lightning has logged the step's metrics.
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Stop before the next step."""
        self._raise_if_stopped()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Stop at the end of an epoch without validation."""
        self._raise_if_stopped()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Stop after the last step; let the last agreement finish first. Training is over."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
        self._raise_if_stopped()
        self.signals.enter(Phase.FINISHING)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Close the CPU group on every rank, before the job's process group goes.

        Left open, its keys stay in the rendezvous store, and the next job of a sweep
        that reuses the store's port (a fixed ``MASTER_PORT``) fails to connect.
        """
        self._close_group()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Close the CPU group when the run stops early (a preemption included)."""
        self._close_group()

    def _close_group(self) -> None:
        if self._group is not None:
            self._group, group = None, self._group
            dist.destroy_process_group(group)

    def _save(self, trainer: L.Trainer, number: int, where: str) -> Preempted:
        """Begin the stop, write ``last.ckpt`` (every rank takes part), say what was saved."""
        self.signals.begin_stop()
        name = signal.Signals(number).name
        step, epoch = trainer.global_step, trainer.current_epoch
        if trainer.is_global_zero:
            log.warning(
                "%s: every rank stops after step %d%s; saving %s", name, step, where, self.path
            )
        # Every rank takes part; rank 0 writes. The whole state (optimizer, loops), said so:
        # unset, Lightning logs "`weights_only` was not set, defaulting to `False`".
        trainer.save_checkpoint(self.path, weights_only=False)
        for callback in trainer.checkpoint_callbacks:  # summary.json's last_checkpoint
            if isinstance(callback, ModelCheckpoint) and callback.save_last:
                callback.last_model_path = str(self.path)
        message = (
            f"preempted: {name} received; every rank stopped after step {step} (epoch "
            f"{epoch}){where} and {self.path} holds it; run again with ckpt_path=auto (in "
            "this run folder) to continue"
        )
        return Preempted(message, signal=name, step=step, epoch=epoch, checkpoint=str(self.path))

    def _raise_if_stopped(self) -> None:
        if self._stop is not None:
            raise self._stop

    def _agreed(self) -> int:
        """The signal every rank is to stop for now (0: none), noted a step before.

        The ranks all-reduce the largest signal number any of them noted.
        """
        noted = self.signals.received or 0
        if self._group is None:
            return int(noted)
        agreed = 0
        if self._pending is not None:
            self._pending.wait()
            # Read through numpy: the flag is a host tensor and never waits for a device
            # (tests.helpers.host_syncs would count a tensor read).
            agreed = int(self._flag[0])
        if not agreed:
            self._flag[0] = int(noted)
            flag = torch.from_numpy(self._flag)  # shares the array's memory
            self._pending = dist.all_reduce(
                flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True
            )
        return agreed


def _steps_optimizer(trainer: L.Trainer, batch_idx: int) -> bool:
    """Whether Lightning steps the optimizer after batch ``batch_idx`` of the epoch.

    It does after every ``accumulate_grad_batches`` batches, and after an epoch's last.
    """
    done = batch_idx + 1
    return done % trainer.accumulate_grad_batches == 0 or done >= trainer.num_training_batches


VAL_PROGRESS = "epoch_loop.val_loop.batch_progress"
"""Where a Lightning checkpoint keeps the validation loop's batch counts (of ``fit_loop``)."""


def rerun_validation(checkpoint: dict[str, Any]) -> None:
    """Mark ``checkpoint``'s running validation as started and not one batch done.

    Lightning resumes a checkpoint whose validation counts read "ready, started, not
    processed" as stopped inside that validation, and runs it again from its first
    batch (``_EvaluationLoop.restarted_mid_evaluation``) before training on; the
    training counts are those of the last finished step already (a validation runs
    between steps). ``total`` counts the epoch's validations before this one too.
    """
    progress = checkpoint["loops"]["fit_loop"][VAL_PROGRESS]
    current = progress["current"]
    done_before = progress["total"]["completed"] - current["completed"]
    progress["current"] = {"ready": 1, "started": 1, "processed": 0, "completed": 0}
    progress["total"] = {
        "ready": done_before + 1,
        "started": done_before + 1,
        "processed": done_before,
        "completed": done_before,
    }
    progress["is_last_batch"] = False
