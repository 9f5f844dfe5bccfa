"""Relaunching a run: its own overrides come back, and what cannot change mid-run is refused.

``python train.py ckpt_path=last`` (or ``ckpt_path=<run>/checkpoints/<file>.ckpt``)
continues the run as it was started: before Hydra parses the command line,
``restore_overrides`` finds the run folder as ``hydra.run.dir`` will (the
``segscale.run_dir`` resolver of ``resume``), reads the overrides of its latest launch
record (``.hydra/launch-<n>/overrides.yaml``, else ``.hydra/overrides.yaml``) and puts
them in front of the command line's. A recorded override whose key the command line
sets again or deletes is left out, so the command line wins; so is the recorded
``ckpt_path``. Since the result goes through Hydra, this launch's own record and the
ranks that segscale starts get the full list. ``ckpt_path=auto`` (a requeued job, which
has its whole command line), a fresh run and a checkpoint outside a run folder restore
nothing.

The record is read as data, by allow-list (``recorded_overrides``): plain values of
existing keys and config-group options, restored as segscale writes them; they send
no write outside the run folder that the config would not make anyway
(``restored_writes``), and must continue the run in the folder whose record they are.

``check_relaunch`` then refuses, for every relaunch of a run folder that holds a launch
record, an override that would change what the run cannot change mid-run: the keys of
``frozen_keys``, compared with the latest launch record's ``config.yaml`` (read as data
too: ``launch_record.read_record_config``).
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from segscale.configs import compose_config
from segscale.errors import ConfigError
from segscale.runs.folder import RECORD_DIR, read_record_config
from segscale.training.run_folder.frozen_keys import frozen_changes
from segscale.training.run_folder.recorded_overrides import (
    Restorable,
    restorable_overrides,
)
from segscale.training.run_folder.restored_writes import check_generated_tiles, check_value
from segscale.training.run_folder.resume import register_run_dir_resolver

log = logging.getLogger(__name__)

# Keys of the command line that can decide where the run folder is (for the fallback).
_RUN_DIR_KEYS = ("ckpt_path", "task_name", "experiment", "debug", "hydra.")


@dataclass(frozen=True)
class Restored:
    """The overrides ``restore_overrides`` put back, and the record they came from."""

    record: Path
    overrides: tuple[str, ...]


_restored: Restored | None = None  # logged by check_relaunch, once Hydra has set up logging


def restore_overrides(argv: Sequence[str]) -> list[str]:
    """``argv`` (``sys.argv``) with the resumed run's recorded overrides in front of its own.

    Unchanged unless ``ckpt_path`` is ``last`` or a path and the run folder it picks
    holds a launch record with overrides. A command line Hydra would refuse is left to
    Hydra to report. The record is read as data, by allow-list: what
    ``recorded_overrides.restorable_overrides`` accepts and ``_check_in_config`` finds
    in the composed config is exactly what is restored; anything else is refused with
    ``ConfigError`` naming the file and line.
    """
    global _restored
    _restored = None
    parsed = _parse_command_line(argv)
    if parsed is None:
        return list(argv)
    given = list(parsed.overrides)
    try:
        overrides = OverridesParser.create().parse_overrides(given)
    except HydraException:
        return list(argv)
    ckpt = [o for o in overrides if o.key_or_group == "ckpt_path" and not o.is_delete()]
    ckpt_path = ckpt[-1].value() if ckpt else None
    if not isinstance(ckpt_path, str) or ckpt_path in ("", "auto"):
        return list(argv)
    config_name = parsed.config_name or "train"
    composable = _with_config_dir(given, overrides, parsed.config_dir)
    folder = _run_folder(composable, config_name)
    record = latest_record(folder) if folder else None
    if folder is None or record is None or not (record / "overrides.yaml").is_file():
        return list(argv)
    config_dirs = _config_dirs(parsed.config_dir, overrides)
    restorable = restorable_overrides(record / "overrides.yaml", given, config_dirs)
    _check_in_config(restorable, composable, config_name, folder)
    restored = [r.text for r in restorable]
    _restored = Restored(record, tuple(restored)) if restored else None
    # Hydra's parser takes the overrides as one block (it refuses options among them).
    start = _find_block(list(argv), given)
    if start is None:
        return list(argv)
    return [*argv[:start], *restored, *given, *argv[start + len(given) :]]


def _check_in_config(
    restorable: list[Restorable], given: list[str], config_name: str, folder: Path
) -> None:
    """Refuse what only the composed config shows: a key it lacks, a write elsewhere.

    A restored ``key=value`` must set a key that exists once the restored groups and the
    command line are composed, and send no write outside ``folder`` that the config
    would not make anyway (``restored_writes``: the run folder's keys, the stores runs
    share, the synthetic dataset's tiles). Last, the whole, composed, must continue the
    run in ``folder``, no other.
    """
    if not restorable:
        return
    groups = [r.text for r in restorable if r.is_group]
    config = _composed(config_name, [*groups, *given], restorable)
    raw = cast(dict[str, Any], OmegaConf.to_container(config))
    for entry in restorable:
        if not entry.is_group:
            check_value(entry, raw, folder)
    merged = _composed(config_name, [*(r.text for r in restorable), *given], restorable)
    check_generated_tiles(restorable, config, merged)
    moved = OmegaConf.select(merged, "hydra.run.dir", throw_on_resolution_failure=False)
    if moved is None or Path(str(moved)).resolve() != folder.resolve():
        raise ConfigError(
            f"{restorable[0].recorded.path}: the recorded overrides would continue the run in "
            f"{moved}, not in {folder} whose record they are; give the overrides that "
            "choose the run's folder (task_name, experiment, debug) on the command line"
        )


def _composed(config_name: str, overrides: list[str], restorable: list[Restorable]) -> DictConfig:
    """The config of ``overrides`` with Hydra's, as written; a failure is the record's, named."""
    try:
        return compose_config(config_name, overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError(
            f"{restorable[0].recorded.path}: the run's recorded overrides do not compose "
            f"with this command line ({error}); give the values the run needs on the "
            "command line, or start a new run"
        ) from None


def latest_record(folder: Path) -> Path | None:
    """The folder of ``folder``'s latest launch record (``.hydra/launch-<n>/`` or ``.hydra/``)."""
    root = folder / RECORD_DIR
    numbered = [
        (int(match.group(1)), path)
        for path in root.glob("launch-*")
        if (match := re.fullmatch(r"launch-(\d+)", path.name)) and (path / "config.yaml").is_file()
    ]
    if numbered:
        return max(numbered)[1]
    return root if (root / "config.yaml").is_file() else None


def check_relaunch(cfg: DictConfig) -> None:
    """Refuse a relaunch whose config changes a frozen key of its run (``ConfigError``).

    A relaunch is a launch with ``ckpt_path`` set into a run folder (``output_dir``)
    that holds a launch record; this launch's config is compared with that record's.
    """
    global _restored
    if not cfg.get("ckpt_path"):
        return
    if _restored is not None:
        log.info(
            "ckpt_path=%s: restored the run's overrides from %s: %s",
            cfg.ckpt_path,
            _restored.record,
            " ".join(_restored.overrides),
        )
        _restored = None  # said once: a later train() in this process restored nothing
    record = latest_record(Path(cfg.output_dir))
    if record is None:
        return
    started = read_record_config(record / "config.yaml")
    changed = frozen_changes(started, cfg)
    if changed:
        lines = "; ".join(
            f"{key}: the run was started with {old}, this launch has {new}"
            for key, (old, new) in changed.items()
        )
        raise ConfigError(
            f"ckpt_path={cfg.ckpt_path}: {lines} (recorded in {record / 'config.yaml'}). "
            f"{'This' if len(changed) == 1 else 'These'} cannot change mid-run: the "
            "checkpoint's weights, optimizer state, schedule and patch sequence belong to "
            "the run's values. Drop the override to continue the run as it was, or start "
            "a new run with the new values (ckpt_path=null and a new folder)"
        )


def _parse_command_line(argv: Sequence[str]) -> argparse.Namespace | None:
    """Hydra's reading of ``argv``; ``None`` for a sweep, a help page or a bad command line."""
    parser = get_args_parser()
    parser.exit_on_error = False
    try:
        parsed, unknown = parser.parse_known_args(list(argv[1:]))
    except argparse.ArgumentError:
        return None
    if unknown or parsed.multirun or parsed.help or parsed.hydra_help:
        return None
    if parsed.shell_completion or parsed.experimental_rerun:
        return None
    return parsed


def _run_folder(given: list[str], config_name: str) -> Path | None:
    """The run folder ``hydra.run.dir`` picks for the command line's overrides.

    Composed as Hydra will, so that ``task_name`` from an experiment or a debug preset,
    and ``hydra.run.dir`` itself, count. Should the command line not compose alone
    (it changes a key only the record adds), only the keys that can decide the folder
    are composed.
    """
    register_run_dir_resolver()
    essential = [o for o in given if o.lstrip("+~").startswith(_RUN_DIR_KEYS)]
    for overrides in (given, essential):
        try:
            cfg = compose_config(config_name, overrides, return_hydra_config=True)
            folder = OmegaConf.select(cfg, "hydra.run.dir", throw_on_resolution_failure=True)
        except (HydraException, OmegaConfBaseException):
            continue
        return Path(str(folder)) if folder else None
    return None


def _with_config_dir(
    given: list[str], overrides: list[Override], config_dir: str | None
) -> list[str]:
    """``given`` as ``compose_config`` takes it: ``--config-dir`` added to the search path."""
    if not config_dir:
        return list(given)
    paths = [o for o in overrides if o.key_or_group == "hydra.searchpath" and not o.is_delete()]
    entries = paths[-1].value() if paths else []
    entries = [*(entries if isinstance(entries, list) else [entries])]
    entries.append(f"file://{Path(config_dir).resolve()}")
    kept = [g for g, o in zip(given, overrides, strict=True) if o not in paths]
    quoted = ",".join(f"'{entry}'" for entry in entries)
    return [*kept, f"hydra.searchpath=[{quoted}]"]


def _config_dirs(config_dir: str | None, overrides: list[Override]) -> tuple[Path, ...]:
    """The user's config folders: ``--config-dir`` and ``hydra.searchpath``'s ``file://`` ones."""
    found = [Path(config_dir)] if config_dir else []
    for override in overrides:
        if override.key_or_group == "hydra.searchpath" and not override.is_delete():
            entries = override.value()
            for entry in entries if isinstance(entries, list) else [entries]:
                if isinstance(entry, str) and entry.startswith("file://"):
                    found.append(Path(entry.removeprefix("file://")))
    return tuple(found)


def _find_block(argv: list[str], block: list[str]) -> int | None:
    """Where ``block`` starts in ``argv`` (after the program name), if it is there."""
    for start in range(len(argv) - len(block), 0, -1):
        if argv[start : start + len(block)] == block:
            return start
    return None
