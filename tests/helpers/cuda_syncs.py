"""A callback that counts, with CUDA's own sync debug mode, the host syncs of each step.

``torch.cuda.set_sync_debug_mode("warn")`` makes PyTorch warn at every operation that
makes the host wait for the device (``.item()``, a copy to pageable host memory,
``nonzero``, ...). The callback turns it on from the start of each training batch to its
end (forward, backward and the optimizer step) and counts the warnings per step.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch


class CountCudaSyncs(L.Callback):
    """Counts each training step's host syncs on CUDA; writes the counts to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.counts: list[int] = []
        self._catcher: Any = None
        self._caught: list[warnings.WarningMessage] = []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        """Start counting."""
        self._catcher = warnings.catch_warnings(record=True)
        self._caught = self._catcher.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        """Stop counting; keep this step's count."""
        torch.cuda.set_sync_debug_mode("default")
        self._catcher.__exit__(None, None, None)
        self.counts.append(sum("synchroniz" in str(w.message) for w in self._caught))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the counts, one per step."""
        self.path.write_text(json.dumps(self.counts))
