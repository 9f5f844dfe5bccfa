"""Callbacks: run summary, MATLAB's verbose table, progress plot, checkpoints, report."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only

from segscale.atomic_files import write_text_atomically
from segscale.data.labels import class_colours
from segscale.data.sources import display_rgb
from segscale.errors import ConfigError
from segscale.training.evaluation import write_evaluation
from segscale.training.plots import (
    plot_sample_predictions,
    plot_training_progress,
)

log = logging.getLogger(__name__)


class RunSummary(L.Callback):
    """Measures training throughput and writes ``summary.json`` into the run folder.

    Throughput counts the training patches of all ranks over the training time alone:
    validation and the sanity check are excluded. The summary records the final
    metrics, the checkpoints, and the effective values read back from the running
    objects: world size, per-device and global batch, learning rate.
    """

    def __init__(
        self,
        output_dir: str,
        output_network: str = "last-iteration",
        scaling: dict[str, Any] | None = None,
    ) -> None:
        if output_network not in ("last-iteration", "best-validation"):
            raise ConfigError(
                f"training.output_network={output_network!r} is unknown: expected "
                "last-iteration or best-validation"
            )
        self.output_dir, self.output_network = Path(output_dir), output_network
        self.scaling = dict(scaling or {})
        self.patches = 0
        self.train_s = 0.0
        self._fit_start = self._train_start = self._val_start = 0.0
        self._val_s = 0.0
        self._started_at = ""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the wall clock."""
        self._fit_start = time.perf_counter()
        self._started_at = _now()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the training clock (after the sanity check) and log the effective values."""
        self._train_start, self._val_s = time.perf_counter(), 0.0
        if trainer.is_global_zero:
            values = self.effective_values(trainer)
            log.info("effective: %s", ", ".join(f"{k}={v}" for k, v in values.items()))

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: dict[str, torch.Tensor],
        batch_idx: int,
    ) -> None:
        """Count this batch's patches on every rank."""
        self.patches += batch["image"].shape[0] * trainer.world_size

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Pause the training clock."""
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Resume the training clock."""
        if self._train_start:
            self._val_s += time.perf_counter() - self._val_start

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Stop the training clock."""
        self.train_s = time.perf_counter() - self._train_start - self._val_s

    FILE = "summary.json"

    @staticmethod
    def read(run_folder: str | Path) -> dict[str, Any] | None:
        """The summary a run wrote into ``run_folder``; ``None`` if it did not finish."""
        path = Path(run_folder) / RunSummary.FILE
        return json.loads(path.read_text()) if path.is_file() else None

    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write ``summary.json`` (rank 0 only)."""
        self._write(self.summary(trainer, pl_module))

    @rank_zero_only
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Write ``summary.json`` with the failure, if this launch started training.

        A launch that failed before its first step (a resume refused by Lightning, say)
        leaves the summary of the run it tried to continue as it was.
        """
        if not self._train_start:
            return
        self.train_s = time.perf_counter() - self._train_start - self._val_s
        summary = self.summary(trainer, pl_module)
        self._write(
            summary | {"status": "failed", "error": f"{type(exception).__name__}: {exception}"}
        )

    def _write(self, summary: dict[str, Any]) -> None:
        write_text_atomically(self.output_dir / self.FILE, json.dumps(summary, indent=2))

    @staticmethod
    def effective_values(trainer: L.Trainer) -> dict[str, Any]:
        """World size, devices, batch sizes and learning rate, read from the running objects."""
        loader = trainer.train_dataloader
        sampler = getattr(loader, "batch_sampler", None)
        # Every rank's batch size: EpochShardSampler knows them all (uneven devices).
        batch_sizes = list(getattr(sampler, "batch_sizes", []))
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        strategy = trainer.strategy
        devices = getattr(strategy, "parallel_devices", None) or [strategy.root_device]
        return {
            "world_size": trainer.world_size,
            "num_nodes": trainer.num_nodes,
            "accelerator": type(trainer.accelerator).__name__,
            "devices": [str(d) for d in devices],
            "per_device_batch_sizes": batch_sizes,
            "global_batch_size": sum(batch_sizes) or None,
            # The base rate the schedule multiplies; LambdaLR keeps it as "initial_lr".
            "learning_rate": optimizer.param_groups[0].get("initial_lr") if optimizer else None,
            "final_learning_rate": optimizer.param_groups[0]["lr"] if optimizer else None,
        }

    def summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """The run's summary as a JSON-ready dict, of a run that finished.

        ``on_exception`` gives it ``status: failed`` and the ``error``.
        """
        checkpoint = trainer.checkpoint_callback
        best = getattr(checkpoint, "best_model_path", None) or None
        last = getattr(checkpoint, "last_model_path", None) or None
        return {
            "status": "finished",
            "error": None,
            "metrics": {k: _number(v) for k, v in sorted(trainer.callback_metrics.items())},
            "best_checkpoint": best,
            "best_score": _number(getattr(checkpoint, "best_model_score", None)),
            "last_checkpoint": last,
            # MATLAB's OutputNetwork: the checkpoint this run reports as its result.
            "output_network": self.output_network,
            "output_checkpoint": best if self.output_network == "best-validation" else last,
            **self.effective_values(trainer),
            "scaling": self.scaling,
            "epochs": trainer.current_epoch,
            "steps": trainer.global_step,
            # Steps skipped for a non-finite loss or gradient (training.on_nonfinite=skip).
            "skipped_steps": getattr(pl_module, "skipped_steps", 0),
            "train_patches": self.patches,
            "train_time_s": round(self.train_s, 3),
            "wall_time_s": round(time.perf_counter() - self._fit_start, 3),
            "throughput_patches_per_s": round(self.patches / self.train_s, 3)
            if self.train_s > 0
            else None,
            "started_at": self._started_at,
            "finished_at": _now(),
        }


def _now() -> str:
    """The local time, to the millisecond, in ISO 8601 with its UTC offset."""
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


def _number(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value.item() if isinstance(value, torch.Tensor) else value)
    return number if math.isfinite(number) else None  # JSON has no NaN or Infinity


def _metric(trainer: L.Trainer, key: str) -> float | None:
    value = trainer.callback_metrics.get(key)
    return None if value is None else float(value)


def _current_lr(trainer: L.Trainer) -> float:
    return float(trainer.optimizers[0].param_groups[0]["lr"])


class VerboseLog(L.Callback):
    """MATLAB's ``VerboseFrequency``: a table row every ``frequency`` iterations.

    The columns are MATLAB's: epoch, iteration, elapsed time, mini-batch accuracy and
    loss, validation accuracy and loss (on the rows right after a validation), and the
    learning rate. Rows go to the log (console and ``train.log``), on rank 0 only.
    ``frequency`` 0 turns the table off.
    """

    HEADER = (
        "| Epoch | Iteration | Time Elapsed | Mini-batch Acc | Validation Acc "
        "| Mini-batch Loss | Validation Loss | Learning Rate |"
    )

    def __init__(self, frequency: int = 50) -> None:
        if frequency < 0:
            raise ConfigError(
                f"callbacks.verbose_log.frequency={frequency} is not allowed: expected "
                "iterations >= 0 (0 turns the log off)"
            )
        self.frequency = frequency
        self._start = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the clock and print the header."""
        self._start = time.perf_counter()
        if self.frequency and trainer.is_global_zero:
            log.info(self.HEADER)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Print a row on iteration 1 and every ``frequency`` iterations."""
        if not self.frequency or not trainer.is_global_zero:
            return
        if trainer.global_step == 1 or trainer.global_step % self.frequency == 0:
            log.info(self.row(trainer, validation=False))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Print a row with the validation columns filled."""
        if self.frequency and trainer.is_global_zero and not trainer.sanity_checking:
            log.info(self.row(trainer, validation=True))

    def row(self, trainer: L.Trainer, validation: bool) -> str:
        """One table row for the current iteration."""
        elapsed = int(time.perf_counter() - self._start)
        clock = f"{elapsed // 3600:02d}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}"

        def cell(key: str, width: int, percent: bool = False) -> str:
            value = _metric(trainer, key) if validation or key.startswith("train/") else None
            if value is None:
                return " " * width
            return f"{100 * value:{width - 1}.2f}%" if percent else f"{value:{width}.4f}"

        return (
            f"| {trainer.current_epoch + 1:5d} | {trainer.global_step:9d} | {clock:>12} "
            f"| {cell('train/acc', 14, True)} | {cell('val/acc', 14, True)} "
            f"| {cell('train/loss', 15)} | {cell('val/loss', 15)} "
            f"| {_current_lr(trainer):13.4e} |"
        )


class TrainingProgressPlot(L.Callback):
    """MATLAB's ``Plots='training-progress'``: a PNG redrawn at every validation.

    Training loss, accuracy and learning rate are recorded every
    ``trainer.log_every_n_steps`` iterations (when the mini-batch accuracy is measured);
    the validation loss, accuracy and mIoU at every validation. Rank 0 draws the figure
    (``segscale.training.plots``) and replaces the file atomically.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.train: list[tuple[int, float, float, float]] = []
        self.val: list[tuple[int, float, float, float]] = []

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Record this iteration's loss, accuracy and learning rate, when they were logged."""
        # training_step ran with the step count before this optimizer step
        if not trainer.is_global_zero or trainer.global_step % max(1, trainer.log_every_n_steps):
            return
        loss, acc = _metric(trainer, "train/loss"), _metric(trainer, "train/acc")
        if loss is not None and acc is not None:
            self.train.append((trainer.global_step, loss, acc, _current_lr(trainer)))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Record the validation metrics and redraw the figure."""
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        values = [_metric(trainer, k) for k in ("val/loss", "val/acc", "val/mIoU")]
        if None not in values:
            self.val.append((trainer.global_step, *values))
        plot_training_progress(self.train, self.val, self.path)

    def state_dict(self) -> dict[str, Any]:
        """The curves so far, so that a resumed run continues them."""
        return {"train": self.train, "val": self.val}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the curves of the run being resumed."""
        self.train = [tuple(r) for r in state_dict["train"]]
        self.val = [tuple(r) for r in state_dict["val"]]


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


def periodic_checkpoint(dirpath: str, frequency: int = 0, unit: str = "epoch") -> Callback | None:
    """MATLAB's ``CheckpointPath``/``CheckpointFrequency``/``CheckpointFrequencyUnit``.

    Keeps a checkpoint every ``frequency`` epochs or iterations in ``dirpath``, named
    ``epoch<E>-step<S>.ckpt``; ``frequency`` 0 keeps none (``None``: no callback).
    ``segscale.training.run`` checks that ``dirpath`` is writable before training.
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
    every = {"every_n_epochs": frequency} if unit == "epoch" else {"every_n_train_steps": frequency}
    return ModelCheckpoint(
        dirpath=dirpath,
        filename="epoch{epoch:03d}-step{step:07d}",
        auto_insert_metric_name=False,
        save_top_k=-1,
        save_on_train_epoch_end=True,
        enable_version_counter=False,  # a resumed run rewrites its own files, not -v1 copies
        **every,
    )


class ValidationReport(L.Callback):
    """At the end of training, MATLAB's ``evaluateSemanticSegmentation`` on validation.

    Writes into ``folder``: ``metrics.json`` (global and mean accuracy, mean and
    weighted IoU, mean Dice, and per class accuracy, IoU and Dice),
    ``class_metrics.csv``, ``confusion_matrix.csv`` (rows: true class, columns:
    predicted) and ``confusion_matrix.png``, computed over the whole validation set (all
    ranks) at the last validation; and ``sample_predictions.png`` with ``num_samples``
    validation patches, their ground truth and the final network's prediction.
    """

    def __init__(self, folder: str, num_samples: int = 4) -> None:
        self.folder, self.num_samples = Path(folder), num_samples

    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the report (rank 0 only)."""
        confusion = getattr(pl_module, "last_val_confusion", None)
        if confusion is None:
            log.warning("no validation ran, so there is no evaluation report")
            return
        write_evaluation(self.folder, confusion, list(pl_module.class_names))
        self._plot_samples(trainer, pl_module)

    def _plot_samples(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dataset = getattr(trainer.datamodule, "val_set", None)
        if not dataset or not self.num_samples:
            return
        count = min(self.num_samples, len(dataset))
        picks = [dataset[i] for i in np.linspace(0, len(dataset) - 1, count).round().astype(int)]
        images = torch.stack([p["image"] for p in picks]).to(pl_module.device)
        was_training = pl_module.training
        pl_module.eval()
        with torch.no_grad():
            predictions = pl_module(images).argmax(1).cpu().numpy()
        pl_module.train(was_training)
        names = pl_module.class_names
        colours = class_colours(getattr(trainer.datamodule, "class_colors", None), len(names))
        plot_sample_predictions(
            [display_rgb(p["image"].permute(1, 2, 0).numpy(), pl_module.max_value) for p in picks],
            [p["mask"].numpy().astype(np.uint8) for p in picks],
            predictions.astype(np.uint8),
            pl_module.class_names,
            colours[: len(pl_module.class_names)],
            pl_module.ignore_index,
            self.folder / "sample_predictions.png",
        )
