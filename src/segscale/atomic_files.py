"""Files that appear whole or not at all, with the permissions of any other file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomically(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Create or replace ``path`` with what ``write`` writes to a binary stream.

    The bytes go to a temporary file beside ``path``, are flushed to disk, and the file
    is renamed into place: a rename within one folder is atomic, so a crash, a kill or
    an exception in ``write`` leaves the previous file (or none), never half of one.
    The file gets the permissions a plain ``open(path, "w")`` would give it (the
    process's umask), not the owner-only ones of a temporary file.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o666 & ~current_umask())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def write_text_atomically(path: str | Path, text: str) -> Path:
    """``write_atomically`` for text, encoded as UTF-8."""
    return write_atomically(path, lambda stream: stream.write(text.encode()))


def current_umask() -> int:
    """The process's file-creation mask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
