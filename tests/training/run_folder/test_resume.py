import os
import re
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from segscale.errors import ConfigError
from segscale.models.checkpoint_io import save_checkpoint_file
from segscale.training.callbacks.apply_learning_rate import ApplyLearningRate
from segscale.training.callbacks.forget_abandoned_best import ForgetAbandonedBest
from segscale.training.run.builders import build, build_datamodule, build_module
from segscale.training.run_folder.resume import (
    check_resumable,
    checkpoint_of_rank_zero,
)
from tests.distributed import on_two_ranks


def restored_callback(tmp_path, best_step: int) -> ModelCheckpoint:
    """A best-checkpoint callback as a resume restores it, its file saved at ``best_step``."""
    best = tmp_path / "best.ckpt"
    torch.save({"global_step": best_step}, best)
    callback = ModelCheckpoint(dirpath=tmp_path, filename="best", monitor="val/mIoU", mode="max")
    callback.best_model_path = callback.kth_best_model_path = str(best)
    callback.best_model_score = callback.kth_value = torch.tensor(0.9)
    callback.best_k_models = {str(best): torch.tensor(0.9)}
    return callback


def one_process_trainer(callback: ModelCheckpoint, global_step: int) -> SimpleNamespace:
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


@pytest.mark.parametrize(
    ("version", "message"),
    [("999.0", r"was written by segscale 999\.0, newer than this segscale"), (None, None)],
)
def test_a_resume_refuses_a_checkpoint_of_a_newer_segscale(make_config, tmp_path, version, message):
    cfg = make_config()
    effective = build(cfg.scaling).resolve(cfg.datamodule.batch_size, cfg.optimizer.lr, 1)
    module = build_module(cfg, build_datamodule(cfg, effective), effective.learning_rate)
    checkpoint = {"state_dict": module.state_dict(), "epoch": 1, "global_step": 8}
    module.on_save_checkpoint(checkpoint)
    if version is None:  # written before segscale stored its version: loads
        del checkpoint["segscale"]["segscale_version"]
    else:
        checkpoint["segscale"]["segscale_version"] = version
    path = tmp_path / "last.ckpt"
    save_checkpoint_file(checkpoint, path)
    if message is None:
        check_resumable(str(path), module)
        return
    with pytest.raises(ConfigError, match=rf"ckpt_path='{re.escape(str(path))}'.*{message}"):
        check_resumable(str(path), module)


def _optimizer_and_schedule(rates: list[float]) -> tuple:
    """SGD with one parameter group per rate, its rate halved every step (LambdaLR)."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": rate} for rate in rates]
    for group in groups:
        group["params"][0].grad = torch.ones(1)
    optimizer = torch.optim.SGD(groups, lr=rates[0], momentum=0.9)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)


def test_a_learning_rate_given_on_resume_replaces_the_restored_one_at_its_step():
    saved, saved_schedule = _optimizer_and_schedule([0.1, 0.05])  # encoder at half the rate
    for _ in range(2):
        saved.step()
        saved_schedule.step()
    optimizer, schedule = _optimizer_and_schedule([1.0, 0.5])  # this launch: a new optimizer.lr
    trainer = SimpleNamespace(
        optimizers=[optimizer],
        lr_scheduler_configs=[SimpleNamespace(scheduler=schedule)],
        is_global_zero=True,
    )
    callback = ApplyLearningRate()
    callback.on_fit_start(trainer, None)
    optimizer.load_state_dict(saved.state_dict())  # as Lightning restores them
    schedule.load_state_dict(saved_schedule.state_dict())
    callback.on_train_start(trainer, None)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.25, 0.125])
    assert [g["initial_lr"] for g in optimizer.param_groups] == [1.0, 0.5]
    assert schedule.get_last_lr() == pytest.approx([0.25, 0.125])
    assert "momentum_buffer" in optimizer.state[optimizer.param_groups[0]["params"][0]]
    optimizer.step()
    schedule.step()  # the schedule goes on from its step, with the new base rates
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.125, 0.0625])


def _what_rank_decides(folder: Path, rank: int) -> tuple[str | None, bool]:
    """On one rank of two started as torchrun starts them: its ``ckpt_path=auto`` choice
    and whether it keeps the restored best, when its own view differs from rank 0's."""
    os.environ |= {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0"}
    os.environ |= {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    # Rank 0 sees its best checkpoint saved at step 0 (kept); rank 1 cannot read its own.
    callback = restored_callback(folder / f"rank{rank}", best_step=0)
    if rank == 1:
        Path(callback.best_model_path).write_bytes(b"not a checkpoint")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    found = str(folder / "checkpoints" / f"seen-by-rank{rank}.ckpt")
    agreed = checkpoint_of_rank_zero(trainer, found)
    ForgetAbandonedBest().on_train_start(trainer, None)
    return agreed, callback.best_model_score is not None


@pytest.mark.slow
def test_ranks_started_outside_take_rank_zeros_decisions(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"rank{rank}").mkdir()
    decided = on_two_ranks(partial(_what_rank_decides, tmp_path))
    rank_zeros = str(tmp_path / "checkpoints" / "seen-by-rank0.ckpt")
    assert decided == {0: (rank_zeros, True), 1: (rank_zeros, True)}
