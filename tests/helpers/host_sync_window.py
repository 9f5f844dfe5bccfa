"""A callback that counts the host syncs of one whole training step of a real run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch

from tests.helpers.host_syncs import HostSyncCounter

SIGTERM_PHASE = "lightning_sigterm_broadcast"
"""Where the syncs of Lightning's per-step SIGTERM broadcast go."""


class CountHostSyncs(L.Callback):
    """Counts the host syncs of training step ``step`` on every rank, into ``folder``.

    The window runs from that step's ``on_train_batch_start`` to the next step's, so it
    holds everything Lightning does per step: the forward and backward passes, the
    optimizer step, the logging after it and the loading of the next batch. Inside the
    optimizer step (from ``on_before_optimizer_step`` until the optimizer's step
    returns) counts go to the phase ``optimizer``; inside Lightning's SIGTERM broadcast
    at the start of every DDP step to ``SIGTERM_PHASE`` (a sync of Lightning's own,
    kept apart so that the test can name it); elsewhere to ``step``. Each rank writes
    ``rank<r>.json``: ``{phase: {operation: count}}``.
    """

    def __init__(self, step: int, folder: str) -> None:
        self.step, self.folder = step, Path(folder)
        self.counter: HostSyncCounter | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for optimizer in trainer.optimizers:
            optimizer.register_step_post_hook(self._after_optimizer_step)
        loop = trainer.fit_loop.epoch_loop
        broadcast = getattr(loop, "_broadcast_sigterm_tensor", None)
        if broadcast is not None:

            def counted_apart() -> None:
                if self.counter is None:
                    return broadcast()
                with self.counter.in_phase(SIGTERM_PHASE):
                    return broadcast()

            loop._broadcast_sigterm_tensor = counted_apart

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.counter is not None:
            self._stop(trainer)
        elif trainer.global_step == self.step:
            self.counter = HostSyncCounter("step").__enter__()

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self.counter is not None:
            self.counter.phase = "optimizer"

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, *args: Any) -> None:
        if self.counter is not None:
            self.counter.phase = "step"

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.counter is not None:
            self._stop(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.counter = None

    def _stop(self, trainer: L.Trainer) -> None:
        assert self.counter is not None
        self.counter.__exit__(None, None, None)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.counter.as_dict()))
        self.counter = None

    @staticmethod
    def read(folder: Path) -> dict[int, dict[str, dict[str, int]]]:
        """``{rank: {phase: {operation: count}}}`` as the ranks wrote them into ``folder``."""
        return {
            int(path.stem.removeprefix("rank")): json.loads(path.read_text())
            for path in sorted(folder.glob("rank*.json"))
        }
