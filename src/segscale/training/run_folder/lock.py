"""One run, one folder, one record: the run folder's lock and its launch records.

A run folder belongs to one live run. Its rank 0 holds an exclusive lock on
``<run>/.lock`` (``flock``, which the kernel releases when the process dies, however
it dies), with the holder's pid, host and start time inside, so that a second run
started into the same folder is refused with the holder named, and a lock left by a
dead run is taken over with a warning. On a file system without ``flock`` (Lustre
mounted without ``-o flock``) the lock file itself is the lock, created whole or not
at all; a dead holder on this host is taken over, one on another host must be deleted
by hand. A sweep holds its sweep folder the same way. A fresh run is refused a folder that already
holds another run's results; continuing one is what ``ckpt_path`` is for.

Each launch writes its own record (the composed config, Hydra's config and the
command-line overrides): the first in ``.hydra/``, as Hydra itself writes it, and each
later one (a resume, a requeue) in ``.hydra/launch-<n>/``, so no launch rewrites an
earlier one's.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

from segscale.atomic_files import (
    NO_FLOCK,
    current_umask,
    remove_stale_temporaries,
    temporary_beside,
)
from segscale.errors import ConfigError

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
"""The lock file in a run folder, with its holder's pid, host and start time."""
RESULTS = ("summary.json", "metrics.csv")
"""Files that only a run that trained writes (besides its checkpoints)."""


class RunFolderBusyError(ConfigError):
    """The run folder is held by another live run."""


class RunFolderLock:
    """The exclusive hold of one run (or sweep) folder by this process (a context manager).

    ``what`` names what holds such a folder (``run``, ``sweep``) and ``key`` the setting
    that picks another one, for the refusal. Temporaries that killed writers left in the
    folder and its ``checkpoints/`` are deleted once the folder is held.
    """

    def __init__(self, folder: str | Path, what: str = "run", key: str = "hydra.run.dir") -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self.what = what
        self.key = key
        self._fd: int | None = None
        self._linked: tuple[int, int] | None = None  # the lock file's (dev, inode), no flock

    def __enter__(self) -> RunFolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, or raise ``RunFolderBusyError`` naming the live holder.

        A refused process stops logging into the folder first: the log file there (Hydra
        opened it before any code of ours ran) is the live holder's.
        """
        self._writable()
        try:
            if _flock_works(self.folder):
                self._acquire_flock()
            else:
                self._acquire_link()
        except RunFolderBusyError:
            stop_logging_into(self.folder)
            raise
        for folder in (self.folder, self.folder / "checkpoints"):
            remove_stale_temporaries(folder)

    def _acquire_flock(self) -> None:
        """Hold ``flock`` on the lock file, which the kernel releases when we die."""
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(os.read(fd, 4096))
                os.close(fd)
                raise self._busy(holder) from None
            except OSError:
                os.close(fd)
                raise
            # The holder before us may have removed the file while we opened it: then
            # our lock is on a file nobody else will see, so take the new one.
            if _same_file(fd, self.path):
                break
            os.close(fd)
        self._fd = fd
        previous = os.read(fd, 4096)
        if previous.strip():
            self._taking_over(previous)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_this_process()).encode(), 0)

    def _acquire_link(self) -> None:
        """Without ``flock`` (Lustre without ``-o flock``): the lock file is made whole.

        It is written beside and hard-linked into place, which fails when the file
        exists, on NFS and Lustre too. A file whose holder is dead on this host is taken
        over; one from another host cannot be checked, so it is refused with a hint.
        """
        ours = temporary_beside(self.path)
        try:
            ours.write_text(json.dumps(_this_process()))
            os.chmod(ours, 0o666 & ~current_umask())
            for _ in range(3):
                try:
                    os.link(ours, self.path)
                except FileExistsError:
                    previous = _read_or_empty(self.path)
                    if not _dead_here(previous):
                        raise self._busy(
                            _holder(previous),
                            f"; this file system has no flock, so a lock left by a run that "
                            f"was killed elsewhere cannot be told from a live one: if that "
                            f"{self.what} has ended, delete {self.path}",
                        ) from None
                    self._taking_over(previous)
                    self.path.unlink(missing_ok=True)
                    continue
                written = ours.stat()
                self._linked = (written.st_dev, written.st_ino)
                return
            raise self._busy("holder unknown")
        finally:
            ours.unlink(missing_ok=True)

    def _busy(self, holder: str, hint: str = "") -> RunFolderBusyError:
        return RunFolderBusyError(
            f"{self.folder} is in use by another {self.what} ({holder}), so this {self.what} "
            f"was not started there (one folder holds one {self.what}): wait for it to end, "
            f"or start this one in another folder ({self.key}){hint}"
        )

    def _taking_over(self, previous: bytes) -> None:
        log.warning(
            "%s was locked by a %s that ended without releasing it (%s); taking it over",
            self.folder,
            self.what,
            _holder(previous),
        )

    def _writable(self) -> None:
        """Make the folder; a folder that cannot be made is refused, naming the key."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise self._unwritable(error) from None

    def _open(self) -> int:
        """The lock file, created if need be; a folder that cannot be written is refused."""
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666 & ~current_umask())
        except OSError as error:
            raise self._unwritable(error) from None

    def _unwritable(self, error: OSError) -> ConfigError:
        return ConfigError(
            f"output_dir={str(self.folder)!r}: the {self.what} folder cannot be written "
            f"({error.strerror}); expected a writable folder ({self.key})"
        )

    def release(self) -> None:
        """Give the folder up: remove the lock file, then let go of the lock."""
        if self._linked is not None:
            if _identity(self.path) == self._linked:
                self.path.unlink(missing_ok=True)
            self._linked = None
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


def stop_logging_into(folder: str | Path) -> None:
    """Detach and close the root logger's file handlers that write into ``folder``."""
    inside = Path(folder).resolve()
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and inside in (
            Path(handler.baseFilename).resolve().parents
        ):
            root.removeHandler(handler)
            handler.close()


def check_fresh_folder(folder: str | Path) -> None:
    """Refuse to start a new run in a folder that holds another run's results."""
    folder = Path(folder)
    found = [name for name in RESULTS if (folder / name).exists()]
    found += ["checkpoints/"] if list((folder / "checkpoints").glob("*.ckpt")) else []
    if found:
        raise ConfigError(
            f"{folder} already holds a run ({', '.join(found)}); continue it with "
            f"ckpt_path=auto (or a checkpoint of it), or start this run in another folder "
            "(hydra.run.dir)"
        )


def _this_process() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def _holder(content: bytes) -> str:
    """The holder a lock file names, in words."""
    try:
        facts = json.loads(content.decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        facts = {}
    if not isinstance(facts, dict) or "pid" not in facts:
        return "holder unknown"
    return f"pid {facts['pid']} on host {facts.get('host')}, started {facts.get('started')}"


def _flock_works(folder: Path) -> bool:
    """Whether ``flock`` works in ``folder`` (tried on the folder itself, which stays as it was)."""
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


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _dead_here(content: bytes) -> bool:
    """Whether a lock file names a process of this host that no longer runs."""
    try:
        facts = json.loads(content.decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not isinstance(facts, dict) or facts.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(facts["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, TypeError, ValueError, OverflowError):
        return False  # alive under another user, or no pid to check
    return False


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        facts = path.stat()
    except FileNotFoundError:
        return None
    return (facts.st_dev, facts.st_ino)


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = path.stat()
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (opened.st_dev, opened.st_ino) == (on_disk.st_dev, on_disk.st_ino)
