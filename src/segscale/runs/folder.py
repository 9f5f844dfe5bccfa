"""One run, one folder: the run folder's lock, held by one live run at a time.

Rank 0 holds ``<run>/.lock`` (``segscale.recorded_lock``: filelock's lock, ``flock``
where the file system has it, and the holder's pid, host and start time inside), so
that a second run started into the same folder is refused with the holder named, and
the lock of a run that died is taken over with a warning (without ``flock``, one left
by a run on another host must be deleted by hand). A sweep holds its sweep folder, a
prediction its output folder, the same way.
"""

from __future__ import annotations

import logging
from pathlib import Path

from segscale.atomic_files import remove_stale_temporaries
from segscale.errors import ConfigError
from segscale.recorded_lock import LockHeldError, RecordedLock

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
"""The lock file in a run folder, with its holder's pid, host and start time."""


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
        self.what = what
        self.key = key
        self._lock = RecordedLock(self.folder / LOCK_FILE)

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
        try:
            left = self._lock.acquire()
        except LockHeldError as held:
            stop_logging_into(self.folder)
            raise self._busy(held) from None
        except OSError as error:
            raise ConfigError(
                f"output_dir={str(self.folder)!r}: the {self.what} folder cannot be written "
                f"({error.strerror}); expected a writable folder ({self.key})"
            ) from None
        if left is not None:
            log.warning(
                "%s was locked by a %s that ended without releasing it (%s); taking it over",
                self.folder,
                self.what,
                left,
            )
        for folder in (self.folder, self.folder / "checkpoints"):
            remove_stale_temporaries(folder)

    def _busy(self, held: LockHeldError) -> RunFolderBusyError:
        hint = ""
        if held.soft:
            hint = (
                f"; this file system has no flock, so a lock left by a {self.what} that was "
                f"killed on another host cannot be told from a live one: if that {self.what} "
                f"has ended, delete {held.lock_file}"
            )
        return RunFolderBusyError(
            f"{self.folder} is in use by another {self.what} ({held.holder}), so this "
            f"{self.what} was not started there (one folder holds one {self.what}): wait for "
            f"it to end, or start this one in another folder ({self.key}){hint}"
        )

    def release(self) -> None:
        """Give the folder up: let go of the lock, deleting its file."""
        self._lock.release()


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
