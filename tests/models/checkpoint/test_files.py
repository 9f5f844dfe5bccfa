import errno
import os
import stat

import pytest
import torch

from segscale import atomic_files
from segscale.errors import ConfigError
from segscale.models.checkpoint.files import (
    DIGEST_KEY,
    CheckpointWriteError,
    SafeCheckpointIO,
    load_checkpoint_file,
    save_checkpoint_file,
    written_step,
)


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot save this")


def test_save_is_atomic(tmp_path):
    io = SafeCheckpointIO()
    path = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    assert io.load_checkpoint(path) == {"step": 1}
    with pytest.raises(RuntimeError, match="cannot save"):
        io.save_checkpoint({"step": 2, "bad": Unpicklable()}, path)
    # The failed write left the previous checkpoint intact and no temporary file.
    assert io.load_checkpoint(path) == {"step": 1}
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


def test_checkpoints_get_the_permissions_of_the_other_files(tmp_path):
    save_checkpoint_file({"step": 1}, tmp_path / "a.ckpt")
    (tmp_path / "b.txt").write_text("")
    mode = stat.S_IMODE(os.stat(tmp_path / "a.ckpt").st_mode)
    assert mode == stat.S_IMODE(os.stat(tmp_path / "b.txt").st_mode)


def big_checkpoint() -> dict:
    generator = torch.Generator().manual_seed(0)
    return {
        "state_dict": {"network.weight": torch.randn(1_000_000, generator=generator)},
        "epoch": 3,
        "segscale": {"class_names": ["a", "b"], "mean": [0.5, 0.25]},
    }


def test_a_checkpoint_damaged_in_the_middle_is_refused(tmp_path):
    path = tmp_path / "best.ckpt"
    save_checkpoint_file(big_checkpoint(), path)
    assert torch.equal(
        load_checkpoint_file(path, "ckpt")["state_dict"]["network.weight"],
        big_checkpoint()["state_dict"]["network.weight"],
    )
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 100_000] = bytes(100_000)  # the zip index at the end is intact
    path.write_bytes(bytes(data))
    # torch itself reads the damaged file without a word, with the zeros in the weights.
    damaged = torch.load(path, weights_only=True)["state_dict"]["network.weight"]
    assert (damaged == 0).sum() >= 20_000
    with pytest.raises(ConfigError, match=r"ckpt='.*best\.ckpt' is damaged"):
        load_checkpoint_file(path, "ckpt")


def test_a_changed_value_is_refused_and_a_checkpoint_without_digest_too(tmp_path):
    path = tmp_path / "x.ckpt"
    save_checkpoint_file(big_checkpoint(), path)
    content = torch.load(path, weights_only=True)
    content["epoch"] = 4
    torch.save(content, path)
    with pytest.raises(ConfigError, match="is damaged"):
        load_checkpoint_file(path, "ckpt_path")
    del content[DIGEST_KEY]
    torch.save(content, path)
    with pytest.raises(ConfigError, match=r"ckpt_path='.*x\.ckpt' carries no content digest"):
        load_checkpoint_file(path, "ckpt_path")


def failing_writes(monkeypatch, error: BaseException, after: int = 100_000) -> None:
    """Writes into a new file fail once ``after`` bytes are written (a full disk, a signal)."""
    real_open = open

    class Failing:
        def __init__(self, file):
            self.file, self.written = file, 0

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self.file.close()

        def write(self, data):
            self.written += len(data)
            if self.written > after:
                raise error
            return self.file.write(data)

    def fake_open(path, mode="r", *args, **kwargs):
        file = real_open(path, mode, *args, **kwargs)
        return Failing(file) if mode == "wb" else file

    monkeypatch.setattr(atomic_files, "open", fake_open, raising=False)


def test_a_full_disk_names_the_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / "best.ckpt"
    save_checkpoint_file({"step": 1}, path)
    failing_writes(monkeypatch, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    with pytest.raises(CheckpointWriteError) as raised:
        save_checkpoint_file(big_checkpoint(), path)
    assert str(raised.value) == (
        f"the checkpoint {path} could not be written: the disk is full; its previous "
        "version, if any, is kept"
    )
    monkeypatch.undo()
    assert load_checkpoint_file(path, "ckpt") == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["best.ckpt"]


def test_an_interrupted_write_says_so_and_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    failing_writes(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt, match=f"write of the checkpoint {path} was interrupted"):
        save_checkpoint_file(big_checkpoint(), path)
    assert list(tmp_path.iterdir()) == []


def test_a_text_file_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "notes.ckpt"
    path.write_text("epoch,loss\n0,1.2\n")  # metrics.csv, say: torch.load raised IndexError
    with pytest.raises(ConfigError, match=r"ckpt_path='.*notes\.ckpt' is not a checkpoint"):
        load_checkpoint_file(path, "ckpt_path")


def test_written_step_reads_the_step_and_none_for_a_file_that_is_no_checkpoint(tmp_path):
    path = tmp_path / "a.ckpt"
    save_checkpoint_file({"global_step": 12, "state_dict": {"w": torch.zeros(3)}}, path)
    assert written_step(path) == 12
    save_checkpoint_file({"state_dict": {}}, path)
    assert written_step(path) == 0  # Lightning's default: written before any step
    (tmp_path / "text.ckpt").write_text("not a checkpoint")
    assert written_step(tmp_path / "text.ckpt") is None
    assert written_step(tmp_path / "missing.ckpt") is None


def test_a_handed_over_checkpoint_is_given_to_lightning_once_without_a_second_read(
    tmp_path, monkeypatch
):
    path = tmp_path / "last.ckpt"
    save_checkpoint_file({"global_step": 3}, path)
    io = SafeCheckpointIO()
    verified = load_checkpoint_file(path, "ckpt_path")
    io.hand_over(path, verified)
    reads = []
    real = load_checkpoint_file

    def counted(*args, **kwargs):
        reads.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr("segscale.models.checkpoint.files.load_checkpoint_file", counted)
    assert io.load_checkpoint(str(path)) is verified  # Lightning passes a str
    assert reads == []
    assert io.load_checkpoint(path) == {"global_step": 3}  # a second load reads the file
    assert len(reads) == 1
    io.hand_over(tmp_path / "other.ckpt", verified)  # another file's content is not given
    assert io.load_checkpoint(path) == {"global_step": 3}
    assert len(reads) == 2
