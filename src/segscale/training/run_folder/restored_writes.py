"""Where a resume's restored overrides may make the run write: its folder, and no new place.

A run folder's record is a file anyone who can write the folder can edit
(``recorded_overrides``), so what it restores must not send a write anywhere the run
would not write without it. What a run writes, and where a restored value may send it:

- its run folder: a key whose default refers to it (``${output_dir}/...``: checkpoints,
  loggers, reports, plots, a profile) takes only a path inside it, links followed and
  ``~`` read both as a name and as the home folder (Lightning expands it); the keys
  beside such a key (a checkpoint's ``filename``, a logger's ``name``) only names;
- stores that runs share (``SHARED_STORES``: MLflow's, Optuna's study, the decode cache in
  segscale's cache folder, Lightning's model registry, Weights & Biases online) only at
  the address the config has anyway;
- the synthetic dataset's tiles (``datamodule.source`` of ``SyntheticTiles``): the
  generator writes a tile set into ``root``, in a folder named by its settings, sized by
  ``num_train``, ``num_val`` and ``image_size``. Restored settings are taken only where
  they name the tile set the config names anyway, or one already on disk (complete: its
  ``meta.json`` written), which the resume then reads and never writes. So neither the
  place nor the size of a generation comes from a record; a run whose tiles were
  deleted is resumed with its settings given on the command line again.
"""

from __future__ import annotations

import re
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from segscale.data.datasets.synthetic import SyntheticTiles
from segscale.training.run_folder.recorded_overrides import Restorable, refusal

RUN_FOLDER_REFERENCE = re.compile(r"\$\{(output_dir|hydra:runtime\.output_dir)\}")
"""A default that refers to the run folder: its key says where the run writes."""
SHARED_STORES = (
    "logger.mlflow.tracking_uri",
    "logger.mlflow.artifact_location",
    "search_trial.storage",
    "datamodule.decode_cache.folder",
    "trainer.model_registry",
    "logger.wandb.offline",
    "logger.wandb.log_model",
)
"""Keys naming stores outside the run folder that runs share (MLflow's, Optuna's study,
the machine's decode cache, which a run writes decoded images into, Lightning's model
registry, which litmodels uploads checkpoints to, Weights & Biases' servers, which
``offline: false`` sends the run to and ``log_model`` its checkpoints)."""
GENERATOR = f"{SyntheticTiles.__module__}.{SyntheticTiles.__qualname__}"
"""The ``datamodule.source._target_`` that writes the data it reads (``SyntheticTiles``)."""
SOURCE = "datamodule.source"


def check_value(entry: Restorable, raw: dict[str, Any], folder: Path) -> None:
    """Refuse ``entry`` (a restored ``key=value``) unless its key exists and it writes inside.

    ``raw`` is the config the value is restored into, as written (interpolations
    unresolved); ``folder`` the run folder the record belongs to.
    """
    found, default = raw_at(raw, entry.key)
    if not found:
        raise refusal(entry.recorded, f"sets {entry.key!r}, which this config does not have")
    value = entry.value
    if entry.key == "output_dir" or _refers_to_run_folder(default):
        if not (isinstance(value, str) and _inside(value, folder)):
            raise refusal(
                entry.recorded,
                f"says where the run writes ({entry.key}), outside its run folder {folder}",
            )
        return
    if entry.key in SHARED_STORES:
        if value != default:
            raise refusal(entry.recorded, f"moves a store that runs share ({entry.key})")
        return
    parent = raw_at(raw, entry.key.rpartition(".")[0])[1] if "." in entry.key else raw
    writes_here = isinstance(parent, dict) and any(map(_refers_to_run_folder, parent.values()))
    path_like = isinstance(default, str) and "/" in default  # a metric's name: val/mIoU
    leaves = isinstance(value, str) and ("/" in value or value in (".", ".."))
    if writes_here and leaves and not path_like:
        raise refusal(
            entry.recorded,
            f"makes a path of {entry.key}, beside where the run writes; expected a name",
        )


def check_generated_tiles(
    restorable: list[Restorable], config: DictConfig, restored: DictConfig
) -> None:
    """Refuse restored values that would make the synthetic dataset generate new tiles.

    ``config`` is the config without the restored values (the restored group options and
    the command line), ``restored`` with them. Their tile sets must be the same folder,
    or the restored one complete on disk already (``SyntheticTiles.prepare`` then writes
    nothing). The refusal names the line without which the set would be one of those
    (``_culprit``), else the line of a root that moved, else the last setting.
    """
    tiles, own = _generator(restored), _generator(config)
    if tiles is None or _harmless(tiles, own):
        return
    settings = [r for r in restorable if _field(r.key) is not None]
    effective = [r for r in settings if r is [s for s in settings if s.key == r.key][-1]]
    moved = own is None or Path(tiles.root).resolve() != Path(own.root).resolve()
    roots = [r for r in effective if moved and _field(r.key) == "root"]
    entry = _culprit(effective, settings, tiles, own) or (roots or effective or restorable)[-1]
    expected = f" (the config's: {own.folder})" if own is not None else ""
    raise refusal(
        entry.recorded,
        f"makes the synthetic dataset ({SOURCE}) generate a tile set in {tiles.folder}, "
        f"which is not on disk{expected}: a record may not choose where a resume writes "
        "data, nor how much",
    )


def _harmless(tiles: SyntheticTiles, own: SyntheticTiles | None) -> bool:
    """Whether ``tiles`` writes nothing the config's ``own`` would not: on disk, or the same."""
    if (tiles.folder / "meta.json").is_file():
        return True
    return own is not None and tiles.folder.resolve() == own.folder.resolve()


def _culprit(
    effective: list[Restorable],
    settings: list[Restorable],
    tiles: SyntheticTiles,
    own: SyntheticTiles | None,
) -> Restorable | None:
    """The restored setting whose line alone makes ``tiles`` harmful, if one does.

    ``effective`` are the lines of ``settings`` that take effect (each key's last).
    Without one, its key takes the line before (or the config's value): a line appended
    to a run's record is found, whichever settings the run itself restored.
    """
    if own is None:
        return None
    for entry in reversed(effective):
        field = cast(str, _field(entry.key))
        same_key = [r for r in settings if r.key == entry.key]
        before = same_key[-2].value if len(same_key) > 1 else getattr(own, field)
        setting: dict[str, Any] = {field: str(before) if field == "root" else before}
        if _harmless(replace(tiles, **setting), own):
            return entry
    return None


def raw_at(raw: Any, key: str) -> tuple[bool, Any]:
    """Whether ``key`` (``a.b.0``) is in ``raw`` (a config as containers), and its value."""
    node = raw
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def _generator(cfg: DictConfig) -> SyntheticTiles | None:
    """The synthetic source ``cfg`` builds (its settings resolved), if it builds one."""
    if OmegaConf.select(cfg, f"{SOURCE}._target_") != GENERATOR:
        return None
    names = [f.name for f in fields(SyntheticTiles)]
    try:
        settings = {n: OmegaConf.select(cfg, f"{SOURCE}.{n}", default=None) for n in names}
    except OmegaConfBaseException:  # left to the run's own checks, which name the key
        return None
    given = {n: v for n, v in settings.items() if v is not None}
    if "root" in given:  # a value of another kind still names a folder (its type is checked later)
        given["root"] = str(given["root"])
    return SyntheticTiles(**given)


def _field(key: str) -> str | None:
    """The source setting ``key`` sets (``datamodule.source.root`` → ``root``), if one."""
    prefix = SOURCE + "."
    return key.removeprefix(prefix) if key.startswith(prefix) else None


def _refers_to_run_folder(value: Any) -> bool:
    """Whether a default (as written) is a place in the run folder: ``${output_dir}/...``."""
    return isinstance(value, str) and RUN_FOLDER_REFERENCE.search(value) is not None


def _inside(value: str, folder: Path) -> bool:
    """Whether ``value`` (relative ones from here) lies in ``folder``, links followed.

    Read as written and with ``~`` expanded: Lightning's checkpoint folder and loggers
    expand it, Path does not.
    """
    inside = folder.resolve()
    return all(
        path.resolve().is_relative_to(inside) for path in (Path(value), Path(value).expanduser())
    )
