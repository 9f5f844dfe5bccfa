"""One run, one folder: its lock, its launch records, the fresh-folder check, its summary.

Rank 0 holds ``<run>/.lock`` (``segscale.recorded_lock``: filelock's lock, ``flock``
where the file system has it, and the holder's pid, host and start time inside), so
that a second run started into the same folder is refused with the holder named, and
the lock of a run that died is taken over with a warning (without ``flock``, one left
by a run on another host must be deleted by hand). A sweep holds its sweep folder, a
prediction its output folder, the same way.

Each launch records itself: the first into ``.hydra/`` (as Hydra does), every later one
(a resume, a requeue) into the next ``.hydra/launch-<n>/``; ``relaunch`` reads them back,
as data. A fresh run takes only a folder without another run's results (continuing a
run is what ``ckpt_path`` is for), and ``summary.json`` is the one file that says how a
run ended: written atomically, read back.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from segscale.atomic_files import remove_stale_temporaries, write_text_atomically
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


RECORD_DIR = ".hydra"
"""Where a run folder keeps its launch records (Hydra's own output subfolder)."""
MAX_CONFIG_BYTES = 4 << 20
"""A recorded config larger than this is not one train.py wrote."""
_REFERENCE = re.compile(r"\$\{[A-Za-z_][\w.\-]*\}")
"""An interpolation that only refers to another key (``${seed}``), no resolver."""


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


def read_record_config(path: Path) -> DictConfig:
    """A launch record's ``config.yaml`` read as data (``ConfigError`` if it is not one).

    The file is in a run folder that others may have written, and OmegaConf calls a
    resolver wherever a value interpolates one (``${oc.env:...}``, ``${oc.create:...}``):
    such values are kept as the text they are, and only references to other keys
    (``${seed}``) still resolve, to the values the file itself holds.
    """
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path}: {size} bytes is not a config train.py records (at most "
                f"{MAX_CONFIG_BYTES}); expected the composed config of a launch"
            )
        loaded = OmegaConf.load(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, OmegaConfBaseException) as error:
        raise ConfigError(
            f"{path}: cannot be read as a launch record's config ({error}); expected the "
            "composed config train.py writes there"
        ) from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(
            f"{path}: not a mapping; expected the composed config train.py writes there"
        )
    return OmegaConf.create(_as_data(OmegaConf.to_container(loaded, resolve=False)))


def _as_data(value: Any) -> Any:
    """``value`` (containers of a loaded config) with every resolver call made literal text."""
    if isinstance(value, dict):
        return {key: _as_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_data(item) for item in value]
    if isinstance(value, str) and not _references_only(value):
        # OmegaConf reads a backslash before "${" as an escape (a literal "${"): each
        # "${" gets one, and the backslashes already before it are doubled to stay text.
        return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", value)
    return value


def _references_only(text: str) -> bool:
    """Whether every interpolation in ``text`` only refers to a key (or there is none)."""
    rest = _REFERENCE.sub("", text)
    return "${" not in rest and ("\\" not in text or "${" not in text)


RESULTS = ("summary.json", "metrics.csv")
"""Files that only a run that trained writes (besides its checkpoints)."""


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


SUMMARY_FILE = "summary.json"
"""The summary's name in the run folder."""


def read_summary(run_folder: str | Path) -> dict[str, Any] | None:
    """The summary a run wrote into ``run_folder``; ``None`` if it did not finish."""
    path = Path(run_folder) / SUMMARY_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def write_summary(run_folder: str | Path, summary: dict[str, Any]) -> None:
    """Create or replace the summary of the run in ``run_folder``."""
    write_text_atomically(Path(run_folder) / SUMMARY_FILE, json.dumps(summary, indent=2))
