"""``datamodule/classes=auto`` in a run: the training masks' classes, put into the config.

``resolve_inferred_classes`` replaces the ``auto`` keys of ``cfg.datamodule`` with the
classes the training masks hold (``segscale.data.classes.class_discovery``), in place, before
anything reads them: the network's outputs (``model.num_classes`` refers to
``datamodule.num_classes``), the loss, the checkpoint's metadata, the launch record and
the keys a relaunch may not change all see the classes found, as if a classes file had
named them. The masks are read through the validation cache, so every rank of a run,
and a resumed run, finds the same classes without reading the masks again.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue

from segscale.atomic_files import write_text_atomically
from segscale.config_schema import plain
from segscale.data.checks.mask_value_scan import scan_mask_values
from segscale.data.classes.class_discovery import (
    CLASSES_FILE,
    OPTION,
    InferredClasses,
    infer_classes,
    is_inferred,
)
from segscale.data.storage.nodata import check_nodata
from segscale.data.storage.sources import DEFAULT_MAX_IMAGE_PIXELS, check_max_image_pixels
from segscale.errors import ConfigError
from segscale.runs.builders import build

log = logging.getLogger(__name__)


def resolve_inferred_classes(
    cfg: DictConfig, run_folder: str | Path | None = None, log_table: bool = True
) -> InferredClasses | None:
    """Put the training masks' classes into ``cfg.datamodule`` if it asks for them.

    Does nothing (returns ``None``) unless ``datamodule.label_ids`` is ``auto``. Else
    sets ``num_classes``, ``class_names``, ``class_colors``, ``label_ids`` and
    ``ignore_ids`` to what was found, logs the classes and, given ``run_folder``, writes
    them there as ``classes.yaml`` (a resumed run, ``ckpt_path`` set, keeps the file its
    run wrote); ``log_table=False`` leaves the table of classes to the caller. Raises
    ``ConfigError`` for settings that do not fit what was found, and
    ``InvalidDatasetError`` when no training mask can be read.
    """
    data = cfg.datamodule
    if not is_inferred(OmegaConf.select(cfg, "datamodule.label_ids")):
        return None
    max_image_pixels = OmegaConf.select(
        cfg, "datamodule.max_image_pixels", default=DEFAULT_MAX_IMAGE_PIXELS
    )
    check_max_image_pixels(max_image_pixels, "datamodule.max_image_pixels")
    try:
        source = build(data.source)
    except MissingMandatoryValue as error:
        raise ConfigError(
            f"{error.full_key} is not set; {OPTION} reads the training masks it names"
        ) from None
    source.prepare()
    nodata = OmegaConf.select(cfg, "datamodule.sampling.nodata", default=None)
    check_nodata(nodata)
    census = scan_mask_values(source, "train", max_image_pixels, also=("val",), nodata=nodata)
    found = infer_classes(
        census,
        ignore_index=int(data.ignore_index),
        ignore_ids=plain(data.get("ignore_ids")) or [],
        class_names=plain(data.get("class_names")),
        class_colors=plain(data.get("class_colors")),
        num_classes=data.num_classes,
    )
    with open_dict(data):
        for key, value in found.settings().items():
            data[key] = value
    where = str(OmegaConf.select(cfg, "datamodule.source.root", default="the dataset"))
    if log_table:
        log.info(
            "%s: %d classes found in the training masks (%s):\n%s",
            OPTION,
            found.num_classes,
            found.kind,
            found.table(),
        )
    if run_folder is not None:
        _write(found, Path(run_folder), where, resumed=bool(cfg.get("ckpt_path")))
    return found


def _write(found: InferredClasses, folder: Path, where: str, resumed: bool) -> None:
    """Write ``classes.yaml``; a resumed run keeps the one its first launch wrote."""
    path = folder / CLASSES_FILE
    if resumed and path.is_file():
        return
    write_text_atomically(path, found.yaml(where))
    log.info("%s: written to %s, ready to copy as a classes file of your own", OPTION, path)
