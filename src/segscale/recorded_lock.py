"""A lock file that names its holder: one process at a time, the others told whom.

The lock itself is filelock's. Where the file system has native locks (``flock``;
``LockFileEx`` on Windows), a ``FileLock`` (the kernel releases it when the holder
dies, however it dies), and the file holds our record of the holder: its pid, host and
start time, written once the lock is held, after the bytes Windows locks against other
readers (``segscale.platforms.files.LOCKED_BYTES``, padded with a newline everywhere).
A record found there on taking the lock was left by a holder that died without
releasing it. Where the file system has no ``flock`` (Lustre mounted without ``-o
flock``, NFS without its lock daemon), a ``SoftFileLock``: the file's existence is the
lock and it holds filelock's record (pid and host); filelock takes over one whose
holder is dead on this host and leaves one from another host, which cannot be checked,
to be deleted by hand.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from datetime import datetime
from pathlib import Path

from filelock import BaseFileLock, FileLock, SoftFileLock, Timeout

from segscale.atomic_files import NO_FLOCK
from segscale.platforms import files

REFUSE_AFTER = 0.05
"""Seconds a lock that is not waited for is tried (every ``RETRY``) before it counts as
held: a soft lock's dead holder is taken over in one try where the file system can swap
two names, in two elsewhere; a ``flock`` file deleted by its holder as this one opened
it, in two."""
RETRY = 0.02
RECORD_WAIT = 1.0
"""Seconds a holder is given to write its record, once it holds the lock."""
MAX_RECORD = 4096
"""Bytes of a lock file read for its record (ours or filelock's: well under 1 KiB)."""


class LockHeldError(Exception):
    """Another process holds the lock; ``holder`` names it, in words."""

    def __init__(self, lock: RecordedLock, holder: str) -> None:
        super().__init__(f"{lock.lock_file} is held by {holder}")
        self.lock_file = lock.lock_file
        self.holder = holder
        self.soft = lock.soft
        """No ``flock``: a holder killed on another host cannot be told from a live one."""


class RecordedLock:
    """The exclusive hold of ``lock_file`` by this process, its holder recorded inside."""

    def __init__(self, lock_file: str | Path) -> None:
        self.lock_file = Path(lock_file)
        self.soft = False
        self._lock: BaseFileLock | None = None
        self._left: str | None = None

    def acquire(self, wait: bool = False) -> str | None:
        """Hold the lock (``wait``: until its holder lets go), or raise ``LockHeldError``.

        Returns the holder, in words, of a lock this one took over (one that ended
        without releasing it), or None; of a soft lock only when not waited for (after a
        wait, its holder most likely released it). ``OSError`` (a folder that cannot be
        written) passes through.
        """
        self.lock_file.parent.mkdir(parents=True, exist_ok=True)
        self.soft = not flock_works(self.lock_file.parent)
        lock: BaseFileLock
        if self.soft:
            before = _read_or_empty(self.lock_file)  # filelock takes a dead holder's over unsaid
            lock = SoftFileLock(self.lock_file)
        else:
            lock = FileLock(self.lock_file, on_acquired=self._record)
        try:
            if wait:
                lock.acquire()  # tried every 50 ms (filelock's default)
            else:
                lock.acquire(timeout=REFUSE_AFTER, poll_interval=RETRY)
        except Timeout:
            raise LockHeldError(self, self.holder()) from None
        self._lock = lock
        if self.soft:
            self._left = in_words(before) if before.strip() and not wait else None
        return self._left

    def _record(self, fd: int) -> None:
        """Note the record a dead holder left in the ``flock`` file, and write ours."""
        left = files.read_at(fd, MAX_RECORD, 0)
        self._left = in_words(left) if left.strip() else None
        os.ftruncate(fd, 0)
        padding = b"\n" * files.LOCKED_BYTES
        files.write_at(fd, padding + json.dumps(_this_process()).encode(), 0)

    def holder(self) -> str:
        """The holder the lock file names, in words (``holder unknown`` without a record).

        A holder that has just taken the lock writes its record a moment later: a record
        missing is waited for, briefly.
        """
        deadline = time.monotonic() + RECORD_WAIT
        skip = 0 if self.soft else files.LOCKED_BYTES
        while not (record := _read_or_empty(self.lock_file, skip)).strip():
            if time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        return in_words(record)

    def release(self) -> None:
        """Let go of the lock, deleting its file.

        filelock keeps a ``flock`` file; deleting it while it is still held leaves the
        folder as it was, and a process that opened it meanwhile finds it gone once it
        gets the ``flock`` (filelock checks the link count) and tries again. A soft lock's
        file filelock deletes itself, once it has checked that it is still its own, and
        so does its Windows lock (Windows deletes no file that is open).
        """
        if self._lock is None:
            return
        if not self.soft and sys.platform != "win32":
            self.lock_file.unlink(missing_ok=True)
        self._lock.release()
        self._lock = None


def in_words(record: bytes) -> str:
    """The holder a lock file names: ``pid <pid> on host <host>, started <time>``.

    Ours is JSON; filelock's soft lock has the pid and the host on two lines, no time.
    """
    text = record.decode(errors="replace")
    try:
        facts = json.loads(text or "{}")
    except json.JSONDecodeError:
        pid, _, rest = text.partition("\n")
        host = rest.partition("\n")[0]
        return f"pid {pid} on host {host}" if pid.isdigit() and host else "holder unknown"
    if not isinstance(facts, dict) or "pid" not in facts:
        return "holder unknown"
    return f"pid {facts['pid']} on host {facts.get('host')}, started {facts.get('started')}"


def flock_works(folder: Path) -> bool:
    """Whether native locks work in ``folder`` (tried on the folder itself, left as it was).

    filelock falls back by itself only where ``flock`` fails with ``ENOSYS``; NFS
    without its lock daemon says ``ENOLCK``. Windows, which opens no folder, locks on
    every file system it writes to (NTFS, SMB shares).
    """
    fd = files.open_folder(folder)
    if fd is None:
        return True
    try:
        if files.lock(fd, wait=False):
            files.unlock(fd)
        # else held by someone: it works
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


def _read_or_empty(path: Path, skip: int = 0) -> bytes:
    """The record in ``path`` after its first ``skip`` bytes (b"" without the file)."""
    try:
        with open(path, "rb") as stream:
            stream.seek(skip)
            return stream.read(MAX_RECORD)
    except FileNotFoundError:
        return b""
