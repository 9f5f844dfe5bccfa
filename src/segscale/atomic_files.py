"""Files that appear whole or not at all, with the permissions of any other file."""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO


def write_atomically(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Create or replace ``path`` with what ``write`` writes to a binary stream.

    The bytes go to a temporary file beside ``path`` (``temporary_beside``) and are
    moved into place (``move_into_place``), so a crash, a kill or an exception in
    ``write`` leaves the previous file (or none), never half of one. What ``write``
    returns (a byte count, say) is ignored.
    """
    temporary = temporary_beside(path)
    try:
        with open(temporary, "wb") as stream:
            write(stream)
        return move_into_place(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def temporary_beside(path: str | Path) -> Path:
    """A new, empty hidden file in ``path``'s folder (made if missing), to write into.

    For writers that need a file name rather than a stream (a memory-mapped TIFF, a
    library that saves by name); ``move_into_place`` finishes it, and a writer that
    gives up deletes it.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    os.close(handle)
    return Path(temporary)


def move_into_place(temporary: str | Path, path: str | Path) -> Path:
    """Flush ``temporary`` to disk and rename it to ``path``; return ``path``.

    A rename within one folder is atomic. The file gets the permissions a plain
    ``open(path, "w")`` would give it (the process's umask), not the owner-only ones of
    a temporary file.
    """
    with open(temporary, "rb+") as stream:
        os.fsync(stream.fileno())
    os.chmod(temporary, 0o666 & ~current_umask())
    os.replace(temporary, path)
    return Path(path)


def write_text_atomically(path: str | Path, text: str) -> Path:
    """``write_atomically`` for text, encoded as UTF-8."""
    return write_atomically(path, lambda stream: stream.write(text.encode()))


def write_csv_atomically(
    path: str | Path, header: Sequence[str], rows: Sequence[Sequence[Any]]
) -> Path:
    """``write_atomically`` for a CSV file of ``header`` and ``rows``."""
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(header)
    writer.writerows(rows)
    return write_text_atomically(path, text.getvalue())


def current_umask() -> int:
    """The process's file-creation mask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
