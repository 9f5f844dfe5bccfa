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
    """

    def __init__(
        self,
        step: int,
        name: str = "SIGTERM",
        rank: int = 0,
        group: bool = False,
        repeat: int = 0,
        pid_dir: str | None = None,
    ) -> None:
        self.step, self.number, self.rank = step, signal.Signals[name], rank
        self.group, self.repeat = group, repeat
        self.pid_dir = Path(pid_dir) if pid_dir else None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.pid_dir is not None:
            self.pid_dir.mkdir(parents=True, exist_ok=True)
            (self.pid_dir / f"rank{trainer.global_rank}.pid").write_text(str(os.getpid()))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        if trainer.global_step != self.step or trainer.global_rank != self.rank:
            return
        self._send()
        if self.repeat:
            threading.Thread(target=self._send_again, daemon=True).start()

    def _send(self) -> None:
        if self.pid_dir is not None and not (self.pid_dir / "signal.time").exists():
            (self.pid_dir / "signal.time").write_text(repr(time.time()))
        if self.group:
            os.killpg(os.getpgid(0), self.number)
        else:
            os.kill(os.getpid(), self.number)

    def _send_again(self) -> None:
        for _ in range(self.repeat):
            time.sleep(0.01)
            self._send()
