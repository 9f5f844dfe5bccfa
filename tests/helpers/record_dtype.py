"""A callback that records the floating-point type the network's convolutions compute in.

Under ``trainer.precision=bf16-mixed`` the first convolution's output inside the training
step must be bfloat16 (autocast active), under ``16-mixed`` float16, and float32 under
``32-true``: a run that finished with a positive loss shows none of this. A convolution,
not the network's output: on CUDA, autocast runs the final upsampling in float32 (seen on
an H200), so the output is float32 in every precision there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch


class RecordOutputDtype(L.Callback):
    """Records the dtype of the first convolution's output in training; writes them to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.dtypes: set[torch.dtype] = set()
        self._hook: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Hook the network's first convolution."""

        def record(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
            if module.training:
                self.dtypes.add(output.dtype)

        first = next(m for m in pl_module.network.modules() if isinstance(m, torch.nn.Conv2d))
        self._hook = first.register_forward_hook(record)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Remove the hook; write the dtypes seen (``["torch.bfloat16"]``, ...)."""
        if self._hook is not None:
            self._hook.remove()
        if trainer.is_global_zero:
            self.path.write_text(json.dumps(sorted(str(d) for d in self.dtypes)))


def recorded_dtypes(path: Path) -> list[str]:
    """The dtypes a ``RecordOutputDtype`` wrote to ``path``."""
    return json.loads(path.read_text())
