"""Files that appear whole or not at all, with the permissions of any other file.

A file is written into a hidden temporary beside it (``.<name>.<random>.tmp``) and
renamed over it once complete. A writer that is killed (SIGKILL, a node lost) leaves
its temporary behind; ``remove_stale_temporaries`` deletes those of a folder that no
live writer holds (``write_atomically`` holds a lock on its temporary while it writes:
``flock``, ``LockFileEx`` on Windows; ``segscale.platforms.files``), so a large
network's half-written checkpoints do not pile up.
"""

from __future__ import annotations

import csv
import errno
import io
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from segscale.platforms import files

log = logging.getLogger(__name__)

TEMPORARY_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")
"""The names ``temporary_beside`` gives (``tempfile.mkstemp``'s 8 random characters)."""

SETTLED_S = 60.0
"""Seconds a temporary is unchanged before a Windows sweep takes it for stale: a writer
renames its temporary an instant after it closes it and lets go of its lock."""

NO_FLOCK = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP)
"""What a lock raises on a file system without locks (Lustre without ``-o flock``, ...)."""


def write_atomically(
    path: str | Path, write: Callable[[BinaryIO], object], durable: bool = True
) -> Path:
    """Create or replace ``path`` with what ``write`` writes to a binary stream.

    The bytes go to a temporary file beside ``path`` (``temporary_beside``) and are
    moved into place (``move_into_place``), so a crash, a kill or an exception in
    ``write`` leaves the previous file (or none), never half of one. What ``write``
    returns (a byte count, say) is ignored. An ``OSError`` of a write to the stream
    (a full disk) names no file: it is given ``path``'s name. ``durable=False`` skips
    the flushes to disk (``move_into_place``): still whole or absent after a kill, but a
    power loss may leave it empty, for files that are checked when read (a cache's).
    """
    temporary = temporary_beside(path)
    try:
        with open(temporary, "wb") as stream:
            # Held until the file is in place: a live writer's temporary is not stale.
            _lock_if_possible(stream.fileno(), wait=True)
            write(stream)
            stream.flush()
            if files.renames_open_files():
                return move_into_place(temporary, path, durable)
        # Windows renames no open file: moved once closed, which lets go of the lock; a
        # temporary so recent is not stale to ``remove_stale_temporaries`` there.
        return move_into_place(temporary, path, durable)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(path)
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


def move_into_place(temporary: str | Path, path: str | Path, durable: bool = True) -> Path:
    """Flush ``temporary`` to disk and rename it to ``path``; return ``path``.

    A rename within one folder is atomic; the folder is flushed after it, so that the
    new name survives a power loss too (``durable=False``: neither flush, see
    ``write_atomically``). The file gets the permissions a plain ``open(path, "w")``
    would give it (the process's umask), not the owner-only ones of a temporary file.
    """
    if durable:
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
    os.chmod(temporary, 0o666 & ~current_umask())
    os.replace(temporary, path)
    if durable:
        _fsync_folder(Path(path).parent)
    return Path(path)


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporaries (``temporary_beside``'s names) that no live writer holds.

    Only ``folder`` itself is searched. A temporary is stale when its lock can be
    taken: ``write_atomically`` holds it while writing, and the kernel releases it when
    the writer dies, however it dies. On a file system without locks nothing is
    deleted (a live writer could not be told from a dead one). On Windows, where a
    writer lets go of its lock just before it renames its temporary (and no open file
    can be deleted), a temporary must also be unchanged for ``SETTLED_S``. Returns what
    was deleted.
    """
    try:
        candidates = [p for p in Path(folder).iterdir() if TEMPORARY_NAME.match(p.name)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = [path for path in candidates if _remove_if_stale(path)]
    if removed:
        log.info("removed %d temporaries of writes that never finished in %s", len(removed), folder)
    return removed


def _remove_if_stale(path: Path) -> bool:
    """Delete the temporary ``path`` if no live writer holds it; whether it was deleted."""
    try:
        fd = files.open_unfollowed(path)
    except OSError:  # gone already, a link, or not ours to open
        return False
    try:
        stale = _lock_if_possible(fd, wait=False, missing=False)
        if stale and files.renames_open_files():
            path.unlink(missing_ok=True)
            return True
    finally:
        os.close(fd)
    # Windows deletes no open file, and a writer lets go of its lock an instant before it
    # renames its temporary: one unchanged for SETTLED_S is a dead writer's.
    if not (stale and _settled(path)):
        return False
    try:
        path.unlink()
    except (FileNotFoundError, PermissionError):  # gone, or opened again meanwhile
        return False
    return True


def _settled(path: Path) -> bool:
    """Whether ``path`` has not changed for ``SETTLED_S`` (a temporary whose writer is gone)."""
    try:
        return time.time() - path.stat().st_mtime >= SETTLED_S
    except FileNotFoundError:
        return False


def _lock_if_possible(fd: int, wait: bool, missing: bool = True) -> bool:
    """Lock ``fd`` (``wait``: until it can); whether it was taken, ``missing`` without locks."""
    try:
        return files.lock(fd, wait)
    except OSError as error:
        if error.errno not in NO_FLOCK:
            raise
        return missing


def _fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename into it) to disk, where the system allows it."""
    try:
        fd = files.open_folder(folder)
    except OSError:  # a folder that cannot be opened for reading: nothing more to do
        return
    if fd is None:  # Windows cannot open a folder to flush it
        return
    try:
        os.fsync(fd)
    except OSError as error:
        # Some file systems (and platforms) cannot fsync a folder.
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def write_text_atomically(path: str | Path, text: str, durable: bool = True) -> Path:
    """``write_atomically`` for text, encoded as UTF-8."""
    return write_atomically(path, lambda stream: stream.write(text.encode()), durable)


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
    """The process's file-creation mask, read without changing it.

    Linux reports it in ``/proc/self/status``; elsewhere it can only be read by setting
    it and setting it back, which for that instant applies to every thread of the process.
    """
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/status", encoding="utf-8") as status:
                for line in status:
                    if line.startswith("Umask:"):
                        return int(line.split()[1], 8)
        except OSError:  # no /proc (a container without it): the portable way below
            pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
