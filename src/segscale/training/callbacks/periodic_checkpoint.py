"""MATLAB's checkpoint path and frequency: a checkpoint kept every N epochs or iterations."""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from segscale.errors import ConfigError


def periodic_checkpoint(dirpath: str, frequency: int = 0, unit: str = "epoch") -> Callback | None:
    """MATLAB's ``CheckpointPath``/``CheckpointFrequency``/``CheckpointFrequencyUnit``.

    Keeps a checkpoint every ``frequency`` epochs or iterations in ``dirpath``, named
    ``epoch<E>-step<S>.ckpt``; ``frequency`` 0 keeps none (``None``: no callback).
    ``segscale.training.run.training_run`` checks that ``dirpath`` is writable before training.
    """
    if unit not in ("epoch", "iteration"):
        raise ConfigError(
            f"callbacks.periodic_checkpoint.unit={unit!r} is unknown: expected epoch or iteration"
        )
    if frequency < 0:
        raise ConfigError(
            f"callbacks.periodic_checkpoint.frequency={frequency} is not allowed: expected >= 0"
        )
    if frequency == 0:
        return None
    return ModelCheckpoint(
        dirpath=dirpath,
        filename="epoch{epoch:03d}-step{step:07d}",
        auto_insert_metric_name=False,
        save_top_k=-1,
        save_on_train_epoch_end=True,
        enable_version_counter=False,  # a resumed run rewrites its own files, not -v1 copies
        # None, ModelCheckpoint's default, for the unit not chosen
        every_n_epochs=frequency if unit == "epoch" else None,
        every_n_train_steps=frequency if unit == "iteration" else None,
    )


def ensure_writable(folder: str, key: str) -> None:
    """Raise ``ConfigError`` naming ``key`` unless files can be created in ``folder``."""
    path = Path(folder)
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ConfigError(
            f"{key}={folder!r}: cannot write checkpoints there ({error.strerror}); "
            "expected a writable folder"
        ) from None
    if created:
        path.rmdir()  # made again when the first checkpoint is saved
