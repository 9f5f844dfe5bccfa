"""What a run records in its folder: ``summary.json`` when it ends, a relaunch's record.

``RunSummary`` writes ``summary.json``: what a run measured, reached and used.
``LaunchRecord``: a relaunch (a resume, a requeue) records itself in its run folder
once it trains.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import lightning as L
import natsort
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, Timer
from lightning.pytorch.utilities import rank_zero_only

from segscale.errors import RunStopped
from segscale.runs.folder import write_launch_record, write_summary
from segscale.training.callbacks.unreadable_tiles import LeftOutTiles
from segscale.training.reporting.run_times import RunClock, RunTimes

log = logging.getLogger(__name__)


class RunSummary(Timer):
    """Measures training throughput and writes ``summary.json`` into the run folder.

    Throughput counts the training patches of all ranks over the training time alone:
    validation and the sanity check are excluded. The summary records the final
    metrics, the checkpoints, and the effective values read back from the running
    objects: world size, per-device and global batch, learning rate.

    Time (``RunTimes``): the time to the first optimizer step and where it went (logged
    at that step too), the wall time split into start-up, training, validation and the
    end, and the steady rate: patches/s after the first tenth of the steps. ``clock``
    holds the start-up phases ``train`` marked before the trainer existed. The training
    stage itself is timed by Lightning's ``Timer``, which this callback is (without a
    duration: it stops nothing). Put first among the callbacks, so that the end starts
    before the others' end-of-training work.

    Learning rates: ``learning_rate`` is the base rate the schedule multiplies and
    ``final_learning_rate`` the rate the last optimizer step of this launch used (of the
    first parameter group, the decoder's). Not the optimizer's rate when training ends:
    Lightning steps a per-step schedule after every optimizer step, so that one is the
    rate of a next step that never comes (0 at the end of a ``poly`` schedule). The
    learning-rate monitor's values (``lr-SGD``, ...) are left out of ``metrics``: the
    monitor records them on logging steps only, so the last one may be several steps
    old; ``metrics.csv`` has them all.

    ``nodata``: what the dataset check found of the images' no-data
    (``NodataReport.summary``: per split, totals and the images that hold any), kept
    as the summary's ``nodata`` entry (``None`` where no check gave it).
    """

    def __init__(
        self,
        output_dir: str,
        output_network: str = "best-validation",
        scaling: dict[str, Any] | None = None,
        fine_tuning: dict[str, Any] | None = None,
        clock: RunClock | None = None,
        nodata: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(duration=None, verbose=False)
        self.output_dir = Path(output_dir)
        self.output_network = output_network
        self.scaling = dict(scaling or {})
        self.fine_tuning = dict(fine_tuning or {})
        self.nodata = nodata
        self.patches = 0
        self._started_at = ""
        self.last_step_rate: float | None = None  # the learning rate of the last optimizer step
        self.times = RunTimes(self, clock)

    def state_dict(self) -> dict[str, Any]:
        """Nothing: a launch's times are its own.

        ``Timer`` would carry the training time of the launches before a resume, which
        the summary does not report; checkpoints stay as they were.
        """
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to restore (``state_dict``)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Close the start-up phase that built the trainer and set up the data."""
        self.times.clock.mark("trainer, ranks, data setup")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Note the time of day the fit starts; close the start-up phase before it."""
        super().on_fit_start(trainer, pl_module)
        self._started_at = _now()
        self.times.clock.mark("model to device, optimizer")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the training clock (after the sanity check) and log the effective values."""
        super().on_train_start(trainer, pl_module)
        self.times.clock.mark("sanity validation, loaders")
        if trainer.is_global_zero:
            values = self.effective_values(trainer)
            log.info("effective: %s", ", ".join(f"{k}={v}" for k, v in values.items()))

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Close the start-up at the first batch, or the validation before this one."""
        self.times.batch_start()

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: dict[str, torch.Tensor],
        batch_idx: int,
    ) -> None:
        """Count this batch's patches on every rank."""
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.patches += batch["image"].shape[0] * trainer.world_size
        first = self.times.first_step_s is None
        self.times.step_end(trainer.global_step, self.patches)
        if first and self.times.first_step_s is not None and trainer.is_global_zero:
            log.info("%s", self.times.startup_line())

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Note the learning rate this optimizer step uses (a number on the host: no sync)."""
        self.last_step_rate = float(optimizer.param_groups[0]["lr"])

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Pause the training clock (the next training batch resumes it)."""
        super().on_validation_start(trainer, pl_module)
        if not trainer.sanity_checking:
            self.times.validation_start()

    @rank_zero_only
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Write ``summary.json`` (rank 0 only), once fitting ended well.

        The last hook of a fit, after every callback's ``on_fit_end`` (where the figures
        drawn in the background are waited for), so that the end is measured whole.
        Lightning calls it only when ``fit`` did not raise (``on_exception`` writes then).
        """
        if stage == "fit":
            summary = self.summary(trainer, pl_module)
            comparison = summary["best_versus_last"]
            if comparison is not None and comparison["within_noise"]:
                log.warning("%s", noise_line(comparison))
            self._write(summary)

    @rank_zero_only
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Write ``summary.json`` with the failure or stop, if this launch started training.

        A run stopped on purpose (``RunStopped``: preempted, pruned) gets its status and
        ``stop`` (the step, the signal, ...) instead of an ``error``.

        A launch that failed before its first step (a resume refused by Lightning, say)
        leaves the summary of the run it tried to continue as it was.
        """
        if self.start_time("train") is None:
            return
        summary = self.summary(trainer, pl_module)
        if isinstance(exception, RunStopped):  # on purpose: preempted, pruned
            ended = {"status": exception.status, "stop": exception.details}
        else:
            ended = {"status": "failed", "error": f"{type(exception).__name__}: {exception}"}
        self._write(summary | ended)

    def _write(self, summary: dict[str, Any]) -> None:
        write_summary(self.output_dir, summary)

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
        }

    def summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """The run's summary as a JSON-ready dict, of a run that finished.

        ``on_exception`` gives it ``status: failed`` and the ``error``, or the status
        and ``stop`` of a run stopped on purpose.
        """
        checkpoint = trainer.checkpoint_callback
        best = getattr(checkpoint, "best_model_path", None) or None
        last = getattr(checkpoint, "last_model_path", None) or None
        rates = monitored_rates(trainer)
        metrics = trainer.callback_metrics.items()
        train_s = self.times.training_s()  # Timer's training stage, less the validations
        return {
            "status": "finished",
            "error": None,
            "metrics": {
                k: _number(v)
                for k, v in sorted(metrics, key=lambda item: natsort.natsort_key(item[0]))
                if k not in rates
            },
            # How validation predicted whole images: evaluate.py's default inference.
            "validation_inference": _checkpoint_metadata(pl_module).get("validation_inference"),
            "best_checkpoint": best,
            "best_score": _number(getattr(checkpoint, "best_model_score", None)),
            "last_checkpoint": last,
            # MATLAB's OutputNetwork: the checkpoint this run reports as its result.
            "output_network": self.output_network,
            "output_checkpoint": best if self.output_network == "best-validation" else last,
            # Whether best.ckpt won on a gap the seed alone makes (SCORE_NOISE).
            "best_versus_last": best_versus_last(trainer),
            **self.effective_values(trainer),
            # None if this launch took no optimizer step (say, a resume of a finished run).
            "final_learning_rate": self.last_step_rate,
            "scaling": self.scaling,
            # training.encoder_lr_factor and training.freeze_encoder_epochs
            "fine_tuning": self.fine_tuning,
            "epochs": trainer.current_epoch,
            # Steps whose updates stand: a non-finite step stops the run a step later.
            "steps": _trusted_steps(trainer, pl_module),
            # Steps skipped for a non-finite loss or gradient (training.on_nonfinite=skip).
            "skipped_steps": getattr(pl_module, "skipped_steps", 0),
            # The images' no-data found by the dataset check: values, pixels, windows.
            "nodata": self.nodata,
            # Tiles found unreadable mid-run and left out (datamodule.skip_unreadable=true).
            "left_out_tiles": left_out_tiles(trainer),
            "train_patches": self.patches,
            "train_time_s": round(train_s, 3),
            # From the process's start (or the train() call): time_measured_from says which.
            "wall_time_s": round(self.times.clock.elapsed(), 3),
            "throughput_patches_per_s": round(self.patches / train_s, 3) if train_s > 0 else None,
            **self.times.split(),
            "started_at": self._started_at,
            "finished_at": _now(),
        }


SCORE_NOISE = 0.01
"""Validation scores closer than this are within a seed's reach: the spread of three
seeds measured in experiments/seed-spread (s.d. 0.005; runs end within 0.010)."""


def best_versus_last(trainer: L.Trainer) -> dict[str, Any] | None:
    """The best and the last validation score and whether they differ by noise alone.

    ``None`` without a best checkpoint or a last score of its monitored metric. Equal
    scores are no choice (best.ckpt is the last network, or scores as it does): not noise.
    """
    checkpoint = trainer.checkpoint_callback
    monitor = getattr(checkpoint, "monitor", None)
    best = _number(getattr(checkpoint, "best_model_score", None))
    last = _number(trainer.callback_metrics.get(monitor)) if monitor else None
    if best is None or last is None:
        return None
    difference = abs(best - last)
    return {
        "metric": monitor,
        "best": best,
        "last": last,
        "difference": round(difference, 6),
        "noise": SCORE_NOISE,
        "within_noise": 0 < difference < SCORE_NOISE,
    }


def noise_line(comparison: dict[str, Any]) -> str:
    """The log line of a best-versus-last gap within the noise, and what to use."""
    return (
        f"best.ckpt and the last network differ by {comparison['difference']:.4f} in "
        f"{comparison['metric']} ({comparison['best']:.4f} vs {comparison['last']:.4f}), "
        f"less than the seed-to-seed spread ({comparison['noise']}): the choice of best is "
        "noise. Prefer last.ckpt (training.output_network=last-iteration), or evaluate "
        "both on the test set (evaluate.py) before choosing"
    )


def _checkpoint_metadata(pl_module: L.LightningModule) -> dict[str, Any]:
    """The module's checkpoint metadata (``inference_metadata``), or ``{}`` without one."""
    return getattr(pl_module, "inference_metadata", None) or {}


def left_out_tiles(trainer: L.Trainer) -> list[dict[str, Any]]:
    """The tiles ``LeftOutTiles`` saw left out (file, reason, split, epoch, step)."""
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, LeftOutTiles):
            return [dict(tile) for tile in callback.tiles]
    return []


def monitored_rates(trainer: L.Trainer) -> set[str]:
    """The keys the trainer's learning-rate monitors put into its callback metrics.

    Rates, momenta and weight decays of every parameter group (``lr-SGD``,
    ``lr-SGD/encoder``, ``lr-SGD-momentum``, ...), as each monitor named them.
    """
    keys: set[str] = set()
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, LearningRateMonitor):
            keys |= {*callback.lrs, *callback.last_momentum_values}
            keys |= set(callback.last_weight_decay_values)
    return keys


def _now() -> str:
    """The local time, to the millisecond, in ISO 8601 with its UTC offset."""
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


def _number(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value.item() if isinstance(value, torch.Tensor) else value)
    return number if math.isfinite(number) else None  # JSON has no NaN or Infinity


def _trusted_steps(trainer: L.Trainer, pl_module: L.LightningModule) -> int:
    """Optimizer steps taken, up to the non-finite step that stopped the run if one did."""
    stopped_at = getattr(pl_module, "stopped_at_step", None)
    return trainer.global_step if stopped_at is None else int(stopped_at)


class LaunchRecord(L.Callback):
    """Writes a relaunch's record (a resume, a requeue) when it starts training.

    Only then is the run known to continue: a launch refused before (by Lightning's
    restore, say) leaves the run folder as it was. Rank 0 writes it.
    """

    def __init__(self, folder: str | Path, record: dict[str, str]) -> None:
        self.folder = Path(folder)
        self.record = record

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the record."""
        if trainer.is_global_zero:
            write_launch_record(self.folder, self.record)
