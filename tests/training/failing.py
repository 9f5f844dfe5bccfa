"""A callback that raises on one rank, to test that a DDP run never hangs on a failure."""

import lightning as L


class FailOnRank(L.Callback):
    """Raise at the given training step on the given global rank."""

    def __init__(self, rank: int = 1, step: int = 2) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            raise RuntimeError(f"injected failure on rank {self.rank}")
