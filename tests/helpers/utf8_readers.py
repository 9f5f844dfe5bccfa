"""Files of non-ASCII text written and read back by segscale's writers and readers.

Run by tests/test_text_encodings.py in a Python whose locale encoding is ASCII
(``LC_ALL=C``, ``-X utf8=0``): as cp1252 on Windows, a locale that is not UTF-8, and
stricter (it has no ``ß`` either), so a reader or writer that falls back to the
locale's encoding fails here. File names stay ASCII: that Python's file system encoding
is ASCII too, which Windows' never is (always UTF-8).

``python -m tests.helpers.utf8_readers light|heavy <folder>``.
"""

import locale
import sys
from pathlib import Path

from omegaconf import OmegaConf

CLASSES = ["Straße", "水", "café"]


def light(folder: Path) -> None:
    """summary.json, and a sweep job's overrides and metrics as its summary reads them."""
    from segscale.atomic_files import write_csv_atomically
    from segscale.runs.folder import read_summary, write_summary
    from segscale.sweeps.sweep_summary import read_job

    write_summary(folder, {"classes": CLASSES})
    assert read_summary(folder) == {"classes": CLASSES}
    job = folder / "0"
    overrides = ["datamodule.source.root=/data/Straße", "+note=水"]
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), job / ".hydra" / "overrides.yaml")  # Hydra's way
    header = ["epoch", "step", "val/loss", "val/mIoU", *(f"val/IoU_{c}" for c in CLASSES)]
    write_csv_atomically(job / "metrics.csv", header, [[0, 9, 0.5, 0.25, 0.1, 0.2, 0.3]])
    record = read_job(job)
    assert record.overrides == overrides, record.overrides
    assert record.curve == [(0, 0.5, 0.25)], record.curve


def heavy(folder: Path) -> None:
    """metrics.csv as the CSV logger writes, continues and trims it; image_metrics.csv."""
    import numpy as np

    from segscale.inference.evaluation.image_metrics import (
        ImageScores,
        read_image_metrics,
        write_image_metrics,
    )
    from segscale.training.reporting.loggers import CSVLogger

    logger = CSVLogger(save_dir=str(folder), name="csv", version="0")
    for step in range(3):
        logger.log_metrics({f"val/IoU_{c}": 0.1 * step for c in CLASSES}, step=step)
    logger.save()
    resumed = CSVLogger(save_dir=str(folder), name="csv", version="0")  # reads the header
    resumed.drop_rows_from(2)
    resumed.log_metrics({"val/IoU_水": 0.5}, step=2)
    resumed.save()
    text = (Path(resumed.log_dir) / "metrics.csv").read_text(encoding="utf-8")
    assert text.splitlines()[0] == "step,val/IoU_Straße,val/IoU_café,val/IoU_水", text
    assert [line.split(",")[0] for line in text.splitlines()[1:]] == ["0", "1", "2"], text
    confusion = np.eye(3, dtype=np.int64)
    images = [ImageScores(0, confusion, None)]
    write_image_metrics(folder, images, ["Straße_水.png"], CLASSES)
    assert [row["image"] for row in read_image_metrics(folder)] == ["Straße_水.png"]


if __name__ == "__main__":
    print(f"locale encoding: {locale.getpreferredencoding(False)}")
    {"light": light, "heavy": heavy}[sys.argv[1]](Path(sys.argv[2]))
