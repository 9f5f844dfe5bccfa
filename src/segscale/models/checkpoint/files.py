"""Checkpoint files: written atomically with a digest, read weights-only and verified.

Every checkpoint ``train.py`` writes carries a SHA-256 digest of its content (every
tensor's bytes, dtype and shape, and every plain value, in order). Reading one
(resume, ``predict.py``, ``evaluate.py``) recomputes it and refuses a file whose
content changed since it was written: a disk or copy error that zeroed part of a
tensor would otherwise load as silently wrong weights, because a checkpoint's zip
index can survive damage to its body. Reading never runs code (``read_weights``).
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, cast

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO

from segscale.atomic_files import write_atomically
from segscale.errors import FULL, ConfigError
from segscale.models.weights import LOAD_ERRORS, read_weights

DIGEST_KEY = "segscale_sha256"
"""The checkpoint entry that holds the digest of everything else in it."""

EXPECTED = "a .ckpt file written by segscale's train.py"
"""What errors about a checkpoint say was expected."""


def content_digest(checkpoint: Mapping[str, Any]) -> str:
    """SHA-256 of a checkpoint's content, the digest entry itself left out.

    Tensors count with their key path, dtype, shape and bytes; other values with their
    type and ``repr``, which round-trip through ``torch.save`` unchanged.
    """
    digest = hashlib.sha256()
    _update(digest, "", {k: v for k, v in checkpoint.items() if k != DIGEST_KEY})
    return digest.hexdigest()


def _update(digest: Any, path: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{path}:{tensor.dtype}:{tuple(tensor.shape)}:".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    elif isinstance(value, Mapping):
        digest.update(f"{path}:{{{len(value)}".encode())
        for key, item in value.items():
            _update(digest, f"{path}/{key!r}", item)
    elif isinstance(value, (list, tuple)):
        digest.update(f"{path}:{type(value).__name__}{len(value)}".encode())
        for index, item in enumerate(value):
            _update(digest, f"{path}/{index}", item)
    else:
        digest.update(f"{path}:{type(value).__name__}={value!r};".encode())


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, say); the message names the file."""


def save_checkpoint_file(checkpoint: dict[str, Any], path: str | Path) -> None:
    """Write ``checkpoint`` with its digest to ``path``, atomically.

    A write that fails (a full disk) raises ``CheckpointWriteError``, and one that a
    signal interrupts ``KeyboardInterrupt``, each naming the file: the previous version
    of the file, if any, is left as it was.
    """
    sealed = {**checkpoint, DIGEST_KEY: content_digest(checkpoint)}
    try:
        write_atomically(path, lambda stream: _save(sealed, stream))
    except OSError as error:
        reason = "the disk is full" if error.errno in FULL else (error.strerror or str(error))
        raise CheckpointWriteError(
            f"the checkpoint {path} could not be written: {reason}; its previous version, "
            "if any, is kept"
        ) from error
    except KeyboardInterrupt as error:
        raise KeyboardInterrupt(
            f"the write of the checkpoint {path} was interrupted; its previous version, "
            "if any, is kept"
        ) from error


class _RecordingStream:
    """The stream ``torch.save`` writes into, keeping the error a write raised.

    torch's zip writer turns an exception inside a write (a full disk, a
    KeyboardInterrupt) into its own ``RuntimeError`` (``unexpected pos``), losing it.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.error: BaseException | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.stream.write(data)
        except BaseException as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.stream.flush()


def _save(checkpoint: dict[str, Any], stream: BinaryIO) -> None:
    """``torch.save`` into ``stream``, raising the write's own error when one failed."""
    recording = _RecordingStream(stream)
    try:
        torch.save(checkpoint, cast(BinaryIO, recording))  # torch needs only write (and flush)
    except RuntimeError:
        if recording.error is not None:
            raise recording.error from None
        raise


def load_checkpoint_file(path: str | Path, key: str) -> dict[str, Any]:
    """A checkpoint's content, read weights-only and checked against its digest.

    ``key`` names the config key that gave ``path``, for the errors: a missing,
    unreadable or damaged file, or one without a digest (not written by segscale), is
    refused before anything uses it.
    """
    path = Path(path)
    if path.is_file() and not zipfile.is_zipfile(path):
        # torch.save writes zip archives; anything else (a text file, a legacy pickle,
        # an archive cut short by an interrupted copy) would fail in torch.load with an
        # error that says nothing about the file.
        raise ConfigError(
            f"{key}={str(path)!r} is not a checkpoint, or a truncated one (not a complete "
            f"torch.save archive); expected {EXPECTED}"
        )
    checkpoint = read_weights(path, key, EXPECTED)
    if not isinstance(checkpoint, dict):
        raise ConfigError(f"{key}={str(path)!r} is not a checkpoint; expected {EXPECTED}")
    stored = checkpoint.pop(DIGEST_KEY, None)
    if stored is None:
        raise ConfigError(
            f"{key}={str(path)!r} carries no content digest, so its weights cannot be "
            f"verified; expected {EXPECTED}"
        )
    if content_digest(checkpoint) != stored:
        raise ConfigError(
            f"{key}={str(path)!r} is damaged: its content no longer matches the digest "
            "written with it (a disk, copy or transfer error changed it); use another "
            "checkpoint, or copy it again from where it was written"
        )
    return checkpoint


def written_step(path: str | Path) -> int | None:
    """The optimizer step a checkpoint was written at (its ``global_step``), read cheaply.

    Memory-mapped: only the small entries are read, the tensors stay on disk. Not
    verified against the digest: it decides which rows or files of a run to keep, never
    which weights to use (those are verified when loaded). ``None`` for a file that
    cannot be read as a checkpoint.
    """
    try:
        content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except LOAD_ERRORS:
        return None
    step = content.get("global_step", 0) if isinstance(content, dict) else None
    return step if isinstance(step, int) else None


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O, through ``save_checkpoint_file``/``load_checkpoint_file``.

    Saving is atomic and adds the digest; loading (``trainer.fit(ckpt_path=...)``) is
    weights-only, whatever Lightning asks for, and verified. A checkpoint the run has
    already read and verified (a resume checks it before building the trainer) is
    handed over (``hand_over``) and given to Lightning without a second read.
    """

    def __init__(self) -> None:
        super().__init__()
        self._handed_over: tuple[Path, dict[str, Any]] | None = None

    def hand_over(self, path: str | Path, content: dict[str, Any]) -> None:
        """Keep ``content``, read and verified from ``path``, for Lightning's one load of it."""
        self._handed_over = (Path(path).absolute(), content)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any = None
    ) -> None:
        """Save ``checkpoint`` to ``path`` atomically, with its digest."""
        save_checkpoint_file(checkpoint, path)

    def load_checkpoint(
        self, path: _PATH, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Load a verified checkpoint on the CPU (Lightning moves the weights).

        The content handed over for ``path``, if any, once (it is not kept after).
        """
        handed_over, self._handed_over = self._handed_over, None
        if handed_over is not None and handed_over[0] == Path(path).absolute():
            return handed_over[1]
        return load_checkpoint_file(path, "ckpt_path")
