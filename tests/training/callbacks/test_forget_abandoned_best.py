from types import SimpleNamespace

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from segscale.training.callbacks.forget_abandoned_best import ForgetAbandonedBest


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
