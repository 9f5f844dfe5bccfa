import pytest

from segscale.errors import ConfigError
from segscale.training.callbacks.periodic_checkpoint import (
    ensure_writable,
    periodic_checkpoint,
)
from segscale.training.run.training_run import train

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
