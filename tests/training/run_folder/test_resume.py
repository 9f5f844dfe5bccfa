import os
import re
from functools import partial
from pathlib import Path

import lightning as L
import pytest

from segscale.errors import ConfigError
from segscale.models.checkpoint.files import save_checkpoint_file
from segscale.models.checkpoint.record import CHECKPOINT_FORMAT
from segscale.runs.builders import build, build_datamodule, build_module
from segscale.training.callbacks.checkpoints import ForgetAbandonedBest
from segscale.training.run_folder.resume import (
    check_resumable,
    checkpoint_of_rank_zero,
    read_resumed,
)
from tests.helpers.distributed import on_two_ranks
from tests.training.callbacks.test_checkpoints import (
    restored_callback,
)


@pytest.mark.parametrize(
    ("found", "message"),
    [
        (
            CHECKPOINT_FORMAT + 1,
            rf"has checkpoint_format={CHECKPOINT_FORMAT + 1} \(written by segscale ",
        ),
        (None, r"has no checkpoint_format \(written by segscale .*\); this segscale"),
        (CHECKPOINT_FORMAT, None),
    ],
)
def test_a_resume_refuses_a_checkpoint_of_another_format(make_config, tmp_path, found, message):
    cfg = make_config()
    effective = build(cfg.scaling).resolve(cfg.datamodule.batch_size, cfg.optimizer.lr, 1)
    module = build_module(cfg, build_datamodule(cfg, effective), effective.learning_rate)
    checkpoint = {"state_dict": module.state_dict(), "epoch": 1, "global_step": 8}
    module.on_save_checkpoint(checkpoint)
    if found is None:
        del checkpoint["segscale"]["checkpoint_format"]
    else:
        checkpoint["segscale"]["checkpoint_format"] = found
    path = tmp_path / "last.ckpt"
    save_checkpoint_file(checkpoint, path)
    if message is None:
        check_resumable(read_resumed(str(path)), module)
        return
    with pytest.raises(ConfigError, match=rf"ckpt_path='{re.escape(str(path))}' {message}"):
        read_resumed(str(path))


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
