"""One run, one folder, one record: the run folder's lock and its launch records.

A run folder belongs to one live run. Its rank 0 holds an exclusive lock on
``<run>/.lock`` (``flock``, which the kernel releases when the process dies, however
it dies), with the holder's pid, host and start time inside, so that a second run
started into the same folder is refused with the holder named, and a lock left by a
dead run is taken over with a warning. A fresh run is refused a folder that already
holds another run's results; continuing one is what ``ckpt_path`` is for.

Each launch writes its own record (the composed config, Hydra's config and the
command-line overrides): the first in ``.hydra/``, as Hydra itself writes it, and each
later one (a resume, a requeue) in ``.hydra/launch-<n>/``, so no launch rewrites an
earlier one's.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import lightning as L
from omegaconf import DictConfig, OmegaConf

from segscale.atomic_files import current_umask, write_text_atomically
from segscale.errors import ConfigError

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
"""The lock file in a run folder, with its holder's pid, host and start time."""
RECORD_DIR = ".hydra"
"""Where launch records go (Hydra's own name for its config folder)."""
RESULTS = ("summary.json", "metrics.csv")
"""Files that only a run that trained writes (besides its checkpoints)."""


class RunFolderBusyError(ConfigError):
    """The run folder is held by another live run."""


class RunFolderLock:
    """The exclusive hold of one run folder by this process (a context manager)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> RunFolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, or raise ``RunFolderBusyError`` naming the live holder."""
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(os.read(fd, 4096))
                os.close(fd)
                raise RunFolderBusyError(
                    f"{self.folder} is in use by another run ({holder}), so this run was not "
                    "started there (one folder holds one run): wait for it to end, or start "
                    "this one in another folder (hydra.run.dir)"
                ) from None
            except OSError as error:
                if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):
                    os.close(fd)
                    raise
                log.warning("%s cannot be locked on this file system: not protected", self.folder)
            # The holder before us may have removed the file while we opened it: then
            # our lock is on a file nobody else will see, so take the new one.
            if _same_file(fd, self.path):
                break
            os.close(fd)
        self._fd = fd
        previous = os.read(fd, 4096)
        if previous.strip():
            log.warning(
                "%s was locked by a run that ended without releasing it (%s); taking it over",
                self.folder,
                _holder(previous),
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_this_process()).encode(), 0)

    def _open(self) -> int:
        """The lock file, created if need be; a folder that cannot be written is refused."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666 & ~current_umask())
        except OSError as error:
            raise ConfigError(
                f"output_dir={str(self.folder)!r}: the run folder cannot be written "
                f"({error.strerror}); expected a writable folder (hydra.run.dir)"
            ) from None

    def release(self) -> None:
        """Give the folder up: remove the lock file, then let go of the lock."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


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


def has_launch_record(folder: str | Path) -> bool:
    """Whether a launch has already recorded itself in ``folder``."""
    return (Path(folder) / RECORD_DIR / "config.yaml").is_file()


def launch_record(cfg: DictConfig) -> dict[str, str]:
    """The current launch's record as file name → YAML: config, Hydra's config, overrides.

    Outside a Hydra app (a test, the Python API) only the composed config.
    """
    return {"config.yaml": OmegaConf.to_yaml(cfg), **_hydra_files()}


def write_launch_record(folder: str | Path, record: dict[str, str]) -> Path:
    """Write ``record`` (``launch_record``) into ``folder``; return the record folder.

    The first launch records into ``.hydra/``, every later one into the next free
    ``.hydra/launch-<n>/`` (n = 2, 3, ...).
    """
    root = Path(folder) / RECORD_DIR
    target = root
    number = 1
    while (target / "config.yaml").exists():
        number += 1
        target = root / f"launch-{number}"
    for name, text in record.items():
        write_text_atomically(target / name, text)
    return target


class LaunchRecord(L.Callback):
    """Writes a relaunch's record (a resume, a requeue) when it starts training.

    Only then is the run known to continue: a launch refused before (by Lightning's
    restore, say) leaves the run folder as it was. Rank 0 writes it.
    """

    def __init__(self, folder: str | Path, record: dict[str, str]) -> None:
        self.folder, self.record = Path(folder), record

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the record."""
        if trainer.is_global_zero:
            write_launch_record(self.folder, self.record)


def _hydra_files() -> dict[str, str]:
    """Hydra's own config and the command-line overrides, as Hydra writes them."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    # Hydra annotates it HydraConf, but it holds the config masked to its "hydra" key.
    hydra_cfg = cast(DictConfig | None, HydraConfig.instance().cfg)
    assert hydra_cfg is not None
    return {
        "hydra.yaml": OmegaConf.to_yaml(hydra_cfg),
        "overrides.yaml": OmegaConf.to_yaml(hydra_cfg.hydra.overrides.task),
    }


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


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = path.stat()
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (opened.st_dev, opened.st_ino) == (on_disk.st_dev, on_disk.st_ino)
