from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from segscale.errors import ConfigError
from segscale.training.callbacks.checkpoints import (
    ForgetAbandonedBest,
    ModelCheckpoint,
    ensure_writable,
    periodic_checkpoint,
)
from segscale.training.run.training_run import train


class WorseEachEpoch(BoringModel):
    """A validation score that is best at the first epoch and worse after it."""

    def on_validation_epoch_end(self) -> None:
        self.log("score", 1.0 / (self.current_epoch + 1))


def train_with(callback_type, folder) -> dict[str, int]:
    callback = callback_type(
        dirpath=folder,
        filename="best",
        monitor="score",
        mode="max",
        save_top_k=1,
        save_last=True,
        enable_version_counter=False,
    )
    trainer = L.Trainer(
        max_epochs=3,
        limit_train_batches=2,
        limit_val_batches=1,
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(WorseEachEpoch())
    return {
        name: torch.load(folder / f"{name}.ckpt", weights_only=False)["global_step"]
        for name in ("best", "last")
    }


def test_last_ckpt_is_the_last_state_also_when_the_best_stays_behind(tmp_path):
    assert train_with(ModelCheckpoint, tmp_path / "ours") == {"best": 2, "last": 6}
    # The test has power: Lightning 2.6's own leaves last.ckpt at the best's step.
    assert train_with(LightningModelCheckpoint, tmp_path / "lightning") == {"best": 2, "last": 2}


# The tiny config trains 2 epochs of 4 iterations each (see tests/conftest.py).


def test_periodic_checkpoints_by_iteration_and_epoch(make_config, tmp_path):
    train(
        make_config(
            "callbacks.periodic_checkpoint.frequency=3",
            "callbacks.periodic_checkpoint.unit=iteration",
        )
    )
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("epoch*.ckpt"))
    assert names == ["epoch000-step0000003.ckpt", "epoch001-step0000006.ckpt"]


def test_unwritable_checkpoint_path_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(
        ConfigError, match=r"callbacks\.periodic_checkpoint\.dirpath=.*cannot write"
    ):
        ensure_writable(str(blocker / "checkpoints"), "callbacks.periodic_checkpoint.dirpath")
    with pytest.raises(ConfigError, match=r"unit='hour'"):
        periodic_checkpoint(str(tmp_path), frequency=1, unit="hour")
    assert periodic_checkpoint(str(tmp_path), frequency=0) is None


def restored_callback(tmp_path, best_step: int) -> LightningModelCheckpoint:
    """A best-checkpoint callback as a resume restores it, its file saved at ``best_step``."""
    best = tmp_path / "best.ckpt"
    torch.save({"global_step": best_step}, best)
    callback = LightningModelCheckpoint(
        dirpath=tmp_path, filename="best", monitor="val/mIoU", mode="max"
    )
    callback.best_model_path = callback.kth_best_model_path = str(best)
    callback.best_model_score = callback.kth_value = torch.tensor(0.9)
    callback.best_k_models = {str(best): torch.tensor(0.9)}
    return callback


def one_process_trainer(callback: LightningModelCheckpoint, global_step: int) -> SimpleNamespace:
    """What ForgetAbandonedBest reads of a trainer, of a run in one process."""
    strategy = SimpleNamespace(broadcast=lambda obj, src: obj)
    return SimpleNamespace(
        checkpoint_callbacks=[callback],
        global_step=global_step,
        is_global_zero=True,
        strategy=strategy,
    )


def test_a_best_checkpoint_of_the_abandoned_branch_is_forgotten(tmp_path):
    callback = restored_callback(tmp_path, best_step=12)
    trainer = one_process_trainer(callback, global_step=6)
    ForgetAbandonedBest().on_train_start(trainer, None)
    assert callback.best_k_models == {} and callback.best_model_score is None
    assert callback.best_model_path == "" and callback.kth_value == -torch.inf
    # The new branch's first validation is then better than "nothing": it saves best.ckpt.


def test_a_best_checkpoint_from_before_the_resume_point_is_kept(tmp_path):
    callback = restored_callback(tmp_path, best_step=4)
    trainer = one_process_trainer(callback, global_step=6)
    ForgetAbandonedBest().on_train_start(trainer, None)
    assert callback.best_model_score == torch.tensor(0.9)
    assert callback.best_k_models == {str(tmp_path / "best.ckpt"): torch.tensor(0.9)}
