"""A lock file with a record of its holder: one process at a time, the others told whom.

The lock itself is filelock's: ``FileLock`` (``flock``, which the kernel releases when
the holder dies, however it dies) where the file system has ``flock``, else
``SoftFileLock`` (Lustre mounted without ``-o flock``: the file's existence is the
lock; filelock takes over one whose holder is dead on this host, and leaves one from
another host, which cannot be checked, to be deleted by hand). Ours is the record
beside it: the holder's pid, host and start time, written once the lock is held and
deleted before it is released, so that a process refused (or waiting) can name the
holder, and one that finds a record left behind knows that its holder ended without
releasing the lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from datetime import datetime
from pathlib import Path

from filelock import BaseFileLock, FileLock, SoftFileLock, Timeout

from segscale.atomic_files import NO_FLOCK, write_text_atomically

SOFT_WAIT = 0.1
"""Seconds a soft lock is retried before it counts as held: a dead holder's file is
taken over in one try where the file system can swap two names, in two elsewhere."""
RECORD_WAIT = 1.0
"""Seconds a holder is given to write its record, once it holds the lock."""


class LockHeldError(Exception):
    """Another process holds the lock; ``holder`` names it, in words."""

    def __init__(self, lock: RecordedLock, holder: str) -> None:
        super().__init__(f"{lock.lock_file} is held by {holder}")
        self.lock_file = lock.lock_file
        self.holder = holder
        self.soft = lock.soft
        """No ``flock``: a holder killed on another host cannot be told from a live one."""


class RecordedLock:
    """The exclusive hold of ``lock_file`` (filelock's), with its holder in ``record``."""

    def __init__(self, lock_file: str | Path, record: str | Path) -> None:
        self.lock_file = Path(lock_file)
        self.record = Path(record)
        self.soft = False
        self._lock: BaseFileLock | None = None

    def acquire(self, wait: bool = False) -> str | None:
        """Hold the lock (``wait``: until its holder lets go), or raise ``LockHeldError``.

        Returns the holder, in words, that a record left behind names (a process that
        ended without releasing the lock), or None. ``OSError`` (a folder that cannot be
        written) passes through.
        """
        self.lock_file.parent.mkdir(parents=True, exist_ok=True)
        self.soft = not flock_works(self.lock_file.parent)
        lock = SoftFileLock(self.lock_file) if self.soft else FileLock(self.lock_file)
        try:
            lock.acquire(timeout=-1 if wait else SOFT_WAIT if self.soft else 0)
        except Timeout:
            raise LockHeldError(self, self.holder()) from None
        try:
            left = _read_or_empty(self.record)
            write_text_atomically(self.record, json.dumps(_this_process()))
        except BaseException:
            lock.release()
            raise
        self._lock = lock
        return in_words(left) if left.strip() else None

    def holder(self) -> str:
        """The holder the record names, in words (``holder unknown`` without one).

        A holder that has just taken the lock writes its record a moment later: a record
        missing is waited for, briefly.
        """
        deadline = time.monotonic() + RECORD_WAIT
        while not (record := _read_or_empty(self.record)).strip() and time.monotonic() < deadline:
            time.sleep(0.01)
        return in_words(record)

    def release(self) -> None:
        """Delete the record, then let go of the lock."""
        if self._lock is None:
            return
        self.record.unlink(missing_ok=True)
        self._lock.release()
        self._lock = None


def in_words(record: bytes) -> str:
    """The holder a record names: ``pid <pid> on host <host>, started <time>``."""
    try:
        facts = json.loads(record.decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        facts = {}
    if not isinstance(facts, dict) or "pid" not in facts:
        return "holder unknown"
    return f"pid {facts['pid']} on host {facts.get('host')}, started {facts.get('started')}"


def flock_works(folder: Path) -> bool:
    """Whether ``flock`` works in ``folder`` (tried on the folder itself, left as it was).

    filelock falls back by itself only where ``flock`` fails with ``ENOSYS``; NFS
    without its lock daemon says ``ENOLCK``.
    """
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        return True  # held by someone: it works
    except OSError as error:
        if error.errno in NO_FLOCK:
            return False
        raise
    finally:
        os.close(fd)
    return True


def _this_process() -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""
