from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader

from segscale.api import load
from segscale.errors import ConfigError
from segscale.models.checkpoint.files import load_checkpoint_file
from segscale.training.callbacks.ema import ExponentialMovingAverage, TrainedWeightsOnResume
from segscale.training.run.config_checks import check_config
from segscale.training.run.training_run import train
from tests.helpers.host_syncs import HostSyncCounter

DECAY = 0.5  # far from 1, so that a few steps move the average well away from the weights


class TinyModule(L.LightningModule):
    """A linear layer and batch norm (a buffer the average also keeps) on fixed batches."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.net(batch).pow(2).mean()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val/loss", self.net(batch).pow(2).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def batches(count: int) -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    return DataLoader(
        [torch.randn(4, 2, generator=generator) for _ in range(count)], batch_size=None
    )


class RecordWeights(L.Callback):
    """The trained weights after every optimizer step, and a save inside each validation."""

    def __init__(self, folder: Path | None = None) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []
        self.folder = folder

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps.append({k: v.clone() for k, v in pl_module.state_dict().items()})

    def on_validation_batch_end(self, trainer, pl_module, *args) -> None:
        if self.folder is not None and not trainer.sanity_checking:  # as a preemption does
            trainer.save_checkpoint(self.folder / "in_validation.ckpt")


class CountedAverage(ExponentialMovingAverage):
    """The callback, counting the host syncs of each update."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.syncs: list[dict] = []

    def on_train_batch_end(self, *args) -> None:
        with HostSyncCounter() as counter:
            super().on_train_batch_end(*args)
        self.syncs.append(counter.as_dict())


def fit(folder: Path, max_steps: int, *callbacks: L.Callback, **kwargs) -> L.Trainer:
    """``TinyModule`` for ``max_steps`` of 2-batch epochs; ``last.ckpt`` after every step."""
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=kwargs.pop("limit_val_batches", 0),
        callbacks=[
            kwargs.pop("average", None)
            or ExponentialMovingAverage(DECAY, kwargs.pop("start_step", 0)),
            ModelCheckpoint(folder, save_last=True, save_top_k=0, every_n_train_steps=1),
            *callbacks,
        ],
    )
    trainer.fit(TinyModule(), batches(2), batches(1), **kwargs)
    return trainer


def ema_of(steps: list[dict[str, torch.Tensor]], start_step: int) -> dict[str, torch.Tensor]:
    """The average by its definition: the weights up to ``start_step``, then the EMA."""
    average = {k: v.clone() for k, v in steps[max(start_step, 1) - 1].items()}
    for state in steps[max(start_step, 1) :]:
        for key, value in state.items():
            average[key] = (DECAY * average[key] + (1 - DECAY) * value).to(value.dtype)
    return average


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k].to(a[k].dtype)) for k in a)


@pytest.mark.parametrize("start_step", [0, 2])
def test_checkpoints_hold_the_average_and_the_trained_weights(tmp_path, start_step):
    recorder = RecordWeights()
    fit(tmp_path, 4, recorder, start_step=start_step)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert same(saved["current_model_state"], recorder.steps[-1])
    assert same(saved["state_dict"], ema_of(recorder.steps, start_step))
    assert not same(saved["state_dict"], saved["current_model_state"])


def test_an_update_does_not_wait_for_the_device(tmp_path):
    # AveragedModel.update_parameters reads its count of updates on the host at every
    # update: on a GPU, a wait for the step to finish (docs/architecture.md, "No
    # avoidable host syncs in the training step").
    average = CountedAverage(DECAY, start_step=1)
    recorder = RecordWeights()
    fit(tmp_path, 4, recorder, average=average)
    assert average.syncs == [{}] * 4  # the copies of steps 1 and the averages after
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert same(saved["state_dict"], ema_of(recorder.steps, 1))


def test_a_resumed_run_ends_as_an_uninterrupted_one(tmp_path):
    fit(tmp_path / "whole", 6)
    fit(tmp_path / "part", 4)  # at an epoch's end: these batches are not resumable mid-epoch
    fit(tmp_path / "part", 6, ckpt_path=str(tmp_path / "part" / "last.ckpt"))
    whole, resumed = (
        torch.load(tmp_path / f / "last.ckpt", weights_only=True) for f in ("whole", "part")
    )
    assert resumed["global_step"] == whole["global_step"] == 6
    for key in ("state_dict", "current_model_state", "averaging_state"):
        assert same(resumed[key], whole[key]), key


class LoadedWeights(L.Callback):
    """The network's weights as the fit starts, after the checkpoint's load."""

    def on_train_start(self, trainer, pl_module) -> None:
        self.state = {k: v.clone() for k, v in pl_module.state_dict().items()}


def test_a_resume_with_the_average_off_continues_from_the_trained_weights(tmp_path):
    fit(tmp_path, 2)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    loaded = LoadedWeights()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        callbacks=[TrainedWeightsOnResume(), loaded],
    )
    trainer.fit(TinyModule(), batches(2), ckpt_path=tmp_path / "last.ckpt")
    assert same(loaded.state, saved["current_model_state"])
    assert not same(loaded.state, saved["state_dict"])


def test_a_save_inside_a_validation_keeps_the_average_in_state_dict(tmp_path):
    # A preemption's last.ckpt is written while the validation holds the average in the
    # network: the checkpoint still has the average as its network weights.
    recorder = RecordWeights(tmp_path)
    fit(tmp_path, 2, recorder, limit_val_batches=1)
    inside = torch.load(tmp_path / "in_validation.ckpt", weights_only=True)
    assert same(inside["current_model_state"], recorder.steps[-1])
    assert same(inside["state_dict"], ema_of(recorder.steps, 0))


class RecordValidation(L.Callback):
    """The weights the validation batches are predicted with, after every step's weights."""

    def __init__(self, recorder: RecordWeights) -> None:
        self.recorder = recorder
        self.validated: list[tuple[int, dict[str, torch.Tensor]]] = []  # (steps, weights)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, *args) -> None:
        state = {k: v.clone() for k, v in pl_module.state_dict().items()}
        self.validated.append((len(self.recorder.steps), state))


def test_validation_scores_the_average_not_the_trained_weights(tmp_path):
    # Two validations (after steps 2 and 4): each predicts with the average of the steps
    # so far, and the score it logs is the average's, batch norm's statistics included.
    recorder = RecordWeights()
    validation = RecordValidation(recorder)
    trainer = fit(tmp_path, 4, recorder, validation, limit_val_batches=1)
    assert [steps for steps, _ in validation.validated] == [2, 4]
    for steps, weights in validation.validated:
        assert same(weights, ema_of(recorder.steps[:steps], 0))
        assert not same(weights, recorder.steps[steps - 1])
    averaged = TinyModule()
    averaged.load_state_dict(ema_of(recorder.steps, 0))
    (batch,) = batches(1)
    expected = averaged.eval().net(batch).pow(2).mean()
    assert float(trainer.callback_metrics["val/loss"]) == pytest.approx(float(expected))


@pytest.mark.parametrize(
    "override",
    [
        "training.ema.decay=1",
        "training.ema.decay=0",
        "training.ema.decay=-0.5",
        "training.ema.decay=1.5",
        "training.ema.decay=.nan",
        "training.ema.decay=true",
        "training.ema.decay=fast",
        "training.ema.start_step=-1",
        "training.ema.start_step=1.5",
        "training.ema=0.999",
        "+training.ema.decy=0.999",
    ],
)
def test_a_bad_ema_setting_is_refused_naming_its_key(make_config, override):
    with pytest.raises(ConfigError, match=r"training\.ema"):
        check_config(make_config("training.ema.decay=0.9", override))


def test_a_run_with_a_bad_decay_stops_before_it_builds_anything(make_config):
    # ConfigError: the command line's exit status 2.
    with pytest.raises(
        ConfigError, match=r"training\.ema\.decay=1 is not allowed: expected a number between"
    ):
        train(make_config("training.ema.decay=1"))
    assert not (Path(make_config().output_dir) / "checkpoints").exists()


def test_ema_is_off_by_default_and_null_turns_it_off(make_config):
    check_config(make_config("training.ema=null"))
    assert make_config().training.ema.decay is None


def trained_run(make_config, *overrides: str) -> Path:
    """A tiny real run with EMA; its folder's ``checkpoints/``."""
    train(make_config("training.ema.decay=0.5", "trainer.max_epochs=1", *overrides))
    return Path(make_config().output_dir) / "checkpoints"


def check_run(folder: Path) -> None:
    """best.ckpt's network is the average; inference reads it; batch norm's statistics averaged."""
    best = load_checkpoint_file(folder / "best.ckpt", "ckpt")  # the digest verified
    averaged, trained = best["state_dict"], best["current_model_state"]
    assert averaged.keys() == trained.keys()
    differs = [k for k in averaged if not torch.equal(averaged[k], trained[k])]
    assert any(k.endswith("running_mean") for k in differs)
    assert any(k.endswith("weight") for k in differs)
    network = load(folder / "best.ckpt", device="cpu").module.network
    for name, value in network.state_dict().items():
        assert torch.equal(value, averaged[f"network.{name}"]), name


@pytest.mark.slow
def test_a_ddp_run_with_synchronized_batch_norm_hands_over_the_average(make_config):
    # One real run (two gloo ranks, training.sync_batchnorm's default) for every claim
    # on the whole pipeline: the callback reaches the spawned ranks, best.ckpt holds the
    # average (batch norm's statistics too) beside the trained weights, inference reads it.
    check_run(
        trained_run(
            make_config,
            "strategy=ddp_spawn",
            "trainer.devices=2",
            "trainer.limit_train_batches=2",  # 2 steps: enough to part average and weights
            "callbacks.training_progress=null",
        )
    )
