"""What differs in files: locks, links, folders, reads and writes at an offset, name cases.

The locks are filelock's (``lock_descriptor``): ``flock`` on POSIX systems, the
whole-file lock the kernel drops when its holder dies however it dies; on Windows
``LockFileEx`` on the file's first byte, which Windows drops with the holder's handle
too. On Windows that byte is locked against reads and writes by other processes, not
only against their locks: what other processes read of a locked file (a lock's record
of its holder) starts after it (``LOCKED_BYTES``). And Windows renames and deletes no
file that is open (``renames_open_files``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from filelock import lock_descriptor, unlock_descriptor

LOCKED_BYTES = 1
"""Bytes at the start of a locked file that only its holder may read or write (Windows')."""


def lock(fd: int, wait: bool) -> bool:
    """Lock the file open as ``fd`` exclusively (``wait``: until it can); whether it was taken.

    An ``OSError`` other than contention (a file system without locks: ``ENOSYS``,
    ``ENOLCK``, ``EOPNOTSUPP``) passes through.
    """
    return lock_descriptor(fd, blocking=wait)


def unlock(fd: int) -> None:
    """Release the lock ``lock`` took on ``fd`` (the descriptor stays open)."""
    unlock_descriptor(fd)


def renames_open_files() -> bool:
    """Whether a file may be renamed or deleted while a process has it open.

    Not on Windows, where Python opens files without ``FILE_SHARE_DELETE``: a rename
    or a deletion of an open file fails there (``WinError 32``).
    """
    return sys.platform != "win32"


def folds_case(folder: Path) -> bool:
    """Whether the file system of ``folder`` finds names in any case (``A.png`` is ``a.png``).

    Windows' NTFS and macOS's APFS do by default, Linux's file systems do not; but each
    can be set either way (a case-sensitive APFS volume, a case-folding ext4 folder, a
    Samba share), so the file system is asked: does the name of ``folder`` (or of the
    nearest folder above it with a letter of two cases) in the other case lead to the
    same folder? A path without such a name, or one that is gone, is answered by the
    platform's default.
    """
    for place in (folder, *folder.parents):
        other = place.name.swapcase()
        if other == place.name:
            continue
        try:
            return os.path.samefile(place, place.with_name(other))
        except FileNotFoundError:
            if place.exists():  # the name in the other case is another name
                return False
            break
    return sys.platform in ("win32", "darwin")


def open_unfollowed(path: str | Path) -> int:
    """Open ``path`` for reading without following a symbolic link (where the system can)."""
    if sys.platform == "win32":  # os.open has no such flag there: a link is opened as its target
        return os.open(path, os.O_RDONLY)
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)


def open_folder(folder: str | Path) -> int | None:
    """A descriptor of ``folder`` (to flush or lock it), or None where folders cannot be opened.

    Windows opens no folder with ``os.open``; elsewhere an ``OSError`` passes through.
    """
    if sys.platform == "win32":
        return None
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY)


def read_at(fd: int, size: int, offset: int) -> bytes:
    """Up to ``size`` bytes of ``fd`` from ``offset``."""
    if sys.platform == "win32":  # no pread: seek, then read
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, size)
    return os.pread(fd, size, offset)


def write_at(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` to ``fd`` at ``offset``."""
    if sys.platform == "win32":  # no pwrite: seek, then write
        os.lseek(fd, offset, os.SEEK_SET)
        written = os.write(fd, data)
    else:
        written = os.pwrite(fd, data, offset)
    if written != len(data):
        raise OSError(f"wrote {written} of {len(data)} bytes")
