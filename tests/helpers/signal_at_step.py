"""A callback that sends a real signal at the end of one training step of a real run."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L


class SignalAtStep(L.Callback):
    """After training step ``step`` (global), rank ``rank`` sends ``name``.

    To itself, or with ``group`` to its whole process group (every rank the run started
    and their DataLoader workers, as SLURM signals a job). ``repeat`` more signals follow
    every 10 ms from a thread, while the checkpoint is being saved. Each rank writes its
    pid to ``<pid_dir>/rank<r>.pid`` when training starts, and the sender the time of
    its first signal to ``<pid_dir>/signal.time``.

    ``phase``: ``train`` sends at the end of training step ``step``; ``validation`` at
    the end of batch ``val_batch`` of the validation after step ``step`` (each of whose
    batches then takes ``validation_sleep_s`` longer: a long validation); ``setup`` as
    ``Trainer.fit`` sets up, before the sanity check.
    """

    def __init__(
        self,
        step: int = 0,
        name: str = "SIGTERM",
        rank: int = 0,
        group: bool = False,
        repeat: int = 0,
        pid_dir: str | None = None,
        phase: str = "train",
        val_batch: int = 0,
        validation_sleep_s: float = 0.0,
    ) -> None:
        self.step, self.number, self.rank = step, signal.Signals[name], rank
        self.group, self.repeat = group, repeat
        self.pid_dir = Path(pid_dir) if pid_dir else None
        self.phase, self.val_batch, self.validation_sleep_s = phase, val_batch, validation_sleep_s

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.phase == "setup" and trainer.global_rank == self.rank:
            self._send()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.pid_dir is not None:
            self.pid_dir.mkdir(parents=True, exist_ok=True)
            (self.pid_dir / f"rank{trainer.global_rank}.pid").write_text(str(os.getpid()))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        if self.phase != "train" or trainer.global_step != self.step:
            return
        if trainer.global_rank == self.rank:
            self._send()
            if self.repeat:
                threading.Thread(target=self._send_again, daemon=True).start()

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.phase != "validation" or trainer.sanity_checking:
            return
        if trainer.global_step != self.step:
            return
        time.sleep(self.validation_sleep_s)
        if batch_idx == self.val_batch and trainer.global_rank == self.rank:
            self._send()

    def _send(self) -> None:
        if self.pid_dir is not None and not (self.pid_dir / "signal.time").exists():
            self.pid_dir.mkdir(parents=True, exist_ok=True)
            (self.pid_dir / "signal.time").write_text(repr(time.time()))
        if self.group:
            os.killpg(os.getpgid(0), self.number)
        else:
            os.kill(os.getpid(), self.number)

    def _send_again(self) -> None:
        for _ in range(self.repeat):
            time.sleep(0.01)
            self._send()
