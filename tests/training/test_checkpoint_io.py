import pytest
import torch

from segscale.training.checkpoint_io import AtomicCheckpointIO


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot save this")


def test_save_is_atomic(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    assert torch.load(path, weights_only=True) == {"step": 1}
    with pytest.raises(RuntimeError, match="cannot save"):
        io.save_checkpoint({"step": 2, "bad": Unpicklable()}, path)
    # The failed write left the previous checkpoint intact and no temporary file.
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]
