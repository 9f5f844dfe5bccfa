"""``python data.py``: the dataset as training would see it, without training.

``inspect_dataset`` runs what a training run does with its data before it builds a
network: the config checks of the ``datamodule`` keys, ``datamodule/classes=auto``
(``resolve_inferred_classes``, which writes ``classes.yaml``) and the validation pass
(``SegmentationDataModule.check``, cached). It reports the classes of the training
masks (value, pixels, share, files), what is ignored, and that no mask holds an
unknown value (otherwise the pass stops as it stops training: every problem listed).
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from segscale.config_types import check_types
from segscale.data.checks.dataset_report import SPLIT_WORDS, DatasetReport
from segscale.data.checks.mask_value_scan import scan_mask_values
from segscale.data.classes.class_discovery import class_rows, class_table
from segscale.data.datamodule import SegmentationDataModule
from segscale.errors import integer_at_least, require
from segscale.runs.builders import build, check_data_source
from segscale.training.run.inferred_classes import resolve_inferred_classes

log = logging.getLogger(__name__)


def inspect_dataset(cfg: DictConfig) -> DatasetReport:
    """Check ``cfg.datamodule``'s data as training would; log the report; return it.

    Writes into ``cfg.output_dir``: ``class_frequencies.csv``/``.json`` and, under
    ``datamodule/classes=auto``, ``classes.yaml``. Raises ``ConfigError`` (an
    ``InvalidDatasetError`` listing every unusable file) as training would.
    """
    check_data_source(cfg)
    output = Path(cfg.output_dir)
    found = resolve_inferred_classes(cfg, output, log_table=False)
    _check_datamodule_keys(cfg)
    datamodule: SegmentationDataModule = build(cfg.datamodule, _convert_="all")
    report = datamodule.check()
    labels = datamodule.labels  # its kind reads palette masks by colour or by index
    source, limit = datamodule.source, datamodule.max_image_pixels
    census = scan_mask_values(
        source, "train", limit, labels.colour, nodata=datamodule.sampling.nodata
    )
    rows = class_rows(census, labels, datamodule.class_names)
    kind = census.kind
    how = "found by datamodule/classes=auto" if found else "of the classes file"
    lines = [_images_line(report), f"classes ({how}), in the training masks ({kind}):"]
    lines.append(class_table(rows))
    for split in report.pairs:
        ignored = report.ignored_lines(split)
        lines += [f"  {line}" for line in ignored] or [
            f"  nothing ignored in the {SPLIT_WORDS.get(split, split)} masks"
        ]
    lines.append(
        "unknown mask values: none (every value of the "
        f"{' and '.join(report.pairs)} masks is a class or ignored)"
    )
    lines += report.nodata.lines() if report.nodata is not None else []
    report.write(output)
    log.info("%s", "\n".join(lines))
    return report


def _check_datamodule_keys(cfg: DictConfig) -> None:
    """The checks of ``check_config`` that concern the data: counts and value kinds."""
    key = "datamodule.num_classes"
    value = OmegaConf.select(cfg, key)
    require(value, key, lambda v: isinstance(v, int) and v >= 2, "an integer >= 2")
    key = "datamodule.patch_size"
    require(OmegaConf.select(cfg, key), key, integer_at_least(1), "an integer >= 1")
    check_types(cfg)  # the data command's config holds no other targets


def _images_line(report: DatasetReport) -> str:
    """How many images each split has, their channels, pixel type, mean/std and values."""
    counts = ", ".join(
        f"{len(pairs)} {SPLIT_WORDS.get(split, split)}" for split, pairs in report.pairs.items()
    )
    values = report.value_range
    shown = f"; values {[values.describe(c) for c in range(values.channels)]}" if values else ""
    return (
        f"images: {counts}; {report.channels} channel(s), {report.dtype}; mean "
        f"{list(report.channel_mean)}, std {list(report.channel_std)}{shown} (of the "
        f"training images{_nodata_left_out(report)})"
    )


def _nodata_left_out(report: DatasetReport) -> str:
    """What the statistics leave out: the training images' no-data pixels, where any."""
    found = report.nodata.splits.get("train") if report.nodata is not None else None
    if found is None or not found.nodata_pixels:
        return ""
    return f", less their {found.nodata_pixels:,} no-data pixels"
