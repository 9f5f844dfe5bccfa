"""``python data.py``: the dataset's classes, ignored values and checks, without training."""

import json
import runpy
import subprocess
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from segscale.cli import data as data_cli
from segscale.errors import ConfigError
from tests.conftest import REPO, write_pair
from tests.helpers.in_process import run_in_process


def _tree(root: Path) -> Path:
    """Grey masks of 10, 20 and 30 with a void border of 0; val holds the same levels."""
    rng = np.random.default_rng(0)
    for split, names in (("train", ("a", "b")), ("val", ("c",))):
        for name in names:
            mask = np.full((32, 32), 10, np.uint8)
            mask[8:16] = 20
            mask[16:20] = 30 if name != "b" else 10  # b holds no 30
            mask[:2] = 0  # 64 void pixels per mask
            image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
            write_pair(root, split, name, image, mask)
    return root


def _data(*overrides: str) -> subprocess.CompletedProcess[str]:
    return run_in_process(data_cli.main, *overrides, program="data.py")


def test_the_classes_of_a_tree_are_shown_and_written_without_training(tmp_path):
    root, out = _tree(tmp_path / "data"), tmp_path / "out"
    done = _data(
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "datamodule/classes=auto",
        "datamodule.ignore_ids=[0]",
        "datamodule.patch_size=16",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    log = (out / "data.log").read_text()
    assert "classes (found by datamodule/classes=auto), in the training masks (grey levels):" in log
    table = log[log.index("  class ") :].splitlines()
    assert table[0].split() == ["class", "value", "pixels", "share", "files"]
    # per training mask: 576 px of 10 (+128 in b), 256 of 20, 128 of 30 (a only), 64 of 0
    assert table[1].split() == ["class_10", "10", "1,280", "66.67%", "2"]
    assert table[2].split() == ["class_20", "20", "512", "26.67%", "2"]
    assert table[3].split() == ["class_30", "30", "128", "6.67%", "1"]
    assert "ignore_ids [0]: 128 px, 6.2% of training pixels, ignored" in log
    assert "ignore_ids [0]: 64 px, 6.2% of validation pixels, ignored" in log
    assert "unknown mask values: none" in log
    assert "images: 2 training, 1 validation; 3 channel(s), uint8" in log
    assert "values ['0 to 255', '0 to 255', '0 to 255'] (of the training images)" in log
    classes = OmegaConf.load(out / "classes.yaml")
    assert classes.label_ids == [10, 20, 30] and classes.ignore_ids == [0]
    frequencies = json.loads((out / "class_frequencies.json").read_text())
    assert frequencies["ignored"]["train"] == {"pixels": 128, "share": 0.0625}
    # The folder is said, with what it holds.
    written = "class_frequencies.csv, class_frequencies.json, classes.yaml, data.log"
    assert f"written to {out}: {written}" in done.stdout + done.stderr
    # No network, no checkpoint: the run folder holds the report and nothing else.
    assert sorted(p.name for p in out.iterdir()) == [
        ".hydra",
        "class_frequencies.csv",
        "class_frequencies.json",
        "classes.yaml",
        "data.log",
    ]


def test_a_classes_file_that_does_not_fit_is_refused_as_training_refuses_it(tmp_path):
    root, out = _tree(tmp_path / "data"), tmp_path / "out"
    done = _data(
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "datamodule/classes=binary",
        "datamodule.patch_size=16",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 2, done.stderr[-3000:]
    log = (out / "data.log").read_text()
    assert "3 mask(s) hold 3 values that datamodule/classes=binary does not know" in log
    assert "Traceback" not in done.stdout + done.stderr
    assert not (out / "classes.yaml").exists()
    assert f"written to {out}: data.log" in done.stdout + done.stderr  # where the log is


def test_palette_masks_are_counted_by_their_colours_under_colour_classes(tmp_path):
    from tests.helpers.palette_files import write_palette_mask

    colours = [(60, 16, 152), (132, 41, 246), (110, 193, 228)]
    root, out = tmp_path / "data", tmp_path / "out"
    for split, name in (("train", "a"), ("train", "b"), ("val", "c")):
        mask = np.zeros((32, 32), np.uint8)
        mask[8:16], mask[16:20] = 1, 2
        write_pair(root, split, name, np.zeros((32, 32, 3), np.uint8), mask)
        # one palette for all (classes=auto would read them by index), but colour classes
        write_palette_mask(root / split / f"masks/{name}.png", mask, colours, [1, 2, 0])
    done = _data(
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "datamodule/classes=potsdam_rgb",
        "datamodule.num_classes=3",
        "datamodule.class_names=[building,land,road]",
        f"datamodule.class_colors={[list(c) for c in colours]}".replace(" ", ""),
        "datamodule.patch_size=16",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    log = (out / "data.log").read_text()
    kind = "RGB colours (2 palette mask(s) read by their palettes' colours)"
    assert f"classes (of the classes file), in the training masks ({kind}):" in log
    table = log[log.index("  class ") :].splitlines()
    assert table[1].split() == ["building", "[60,", "16,", "152]", "1,280", "62.50%", "2"]
    assert table[3].split() == ["road", "[110,", "193,", "228]", "256", "12.50%", "2"]


def test_a_missing_root_is_named(tmp_path):
    done = _data("datamodule=folder", f"hydra.run.dir={tmp_path / 'out'}")
    assert done.returncode == 2
    assert "datamodule.source.root is not set" in done.stdout + done.stderr


def test_data_py_inspects_the_synthetic_dataset(tiny_data_root, tmp_path):
    # The data.py file itself run as __main__, in this process: a process of its own
    # would spend ~9 s importing (the shims' exit statuses end to end: train.py's,
    # predict.py's, evaluate.py's and export.py's process tests).
    out = tmp_path / "out"
    done = run_in_process(
        partial(runpy.run_path, str(REPO / "data.py"), run_name="__main__"),
        f"datamodule.source.root={tiny_data_root}",
        "datamodule.source.num_train=2",
        "datamodule.source.num_val=1",
        "datamodule.source.image_size=192",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
        program="data.py",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "classes (of the classes file), in the training masks (grey levels):" in done.stdout
    assert "impervious_surface" in done.stdout and "unknown mask values: none" in done.stdout
    assert "torch.nn" not in done.stdout  # nothing about a network
    assert (out / "class_frequencies.csv").is_file() and not (out / "classes.yaml").exists()


def test_a_nan_pixel_in_a_float_training_image_is_refused_naming_the_file(tmp_path):
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    for split, name in (("train", "a"), ("train", "b"), ("val", "c")):
        image = rng.random((32, 32, 3), dtype=np.float32)
        if name == "b":
            image[5, 6, 0] = np.nan
        write_pair(root, split, name, image, np.zeros((32, 32), np.uint8), image_suffix=".tif")
    done = _data(
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "datamodule.patch_size=16",
        f"output_dir={tmp_path}",
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    assert "Traceback" not in output
    assert f"{root / 'train/images/b.tif'}: has 1 NaN or infinite pixel value(s)" in output


def test_a_min_valid_no_window_holds_is_refused_naming_the_key(tmp_path):
    from tests.helpers.valid_maps import geotiff_dataset

    root, out = geotiff_dataset(tmp_path / "data"), tmp_path / "out"
    done = _data(
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "datamodule.patch_size=64",
        "datamodule.sampling.min_valid=0.9",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 2, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "datamodule.sampling.min_valid=0.9 is not allowed" in output
    assert "(the best holds 0.781)" in output and "Traceback" not in output


def test_a_setting_of_train_py_is_refused_naming_what_data_py_takes(tmp_path):
    out = tmp_path / "out"
    done = _data("model=unet", f"hydra.run.dir={out}")
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith("Error: model=unet: not a setting of data.py, which checks")
    assert "takes datamodule=<option>, datamodule.<key>=..., datamodule/classes=<option>" in (
        done.stderr
    )
    assert "python train.py model=unet trains with it" in done.stderr
    assert "+model" not in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()  # refused before Hydra made the run folder


def test_every_refused_override_is_listed_and_only_train_pys_suggested():
    with pytest.raises(ConfigError) as refused:
        data_cli.refuse_other_keys(["+model=unet", "optimizer.lr=1", "foo=2", "seed=3"])
    message = str(refused.value)
    assert message.startswith("+model=unet, optimizer.lr=1, foo=2: not settings of data.py")
    assert "; model=unet, optimizer.lr=1 are train.py's: python train.py model=unet " in message


@pytest.mark.parametrize(
    "override",
    [
        "model=unet",
        "++model=unet",
        "~model",
        "datamodulex.patch_size=16",  # a longer name that starts like one data.py takes
        "datamodule_extra=1",
        "Datamodule=folder",
        "model.datamodule=folder",  # the allowed name below another key
        "hydras.run.dir=x",
        "trainer.max_epochs=1",
        "training=null",
    ],
)
def test_an_override_outside_data_pys_keys_is_refused(override):
    with pytest.raises(ConfigError, match=r": not a setting of data\.py"):
        data_cli.refuse_other_keys([override])


def test_data_pys_own_keys_and_hydras_flags_pass():
    data_cli.refuse_other_keys(
        [
            "datamodule=folder",
            "datamodule.source.root=/data/x",
            "datamodule/classes=auto",
            "+datamodule.extra=1",
            "~datamodule.ignore_ids",
            "hydra.run.dir=/tmp/x",
            "hydra/job_logging=disabled",
            "seed=3",
            "task_name=look",
            "output_dir=/tmp/y",
            "--cfg",
            "job",
        ]
    )
    data_cli.refuse_other_keys(["datamodule.patch_size=[", "--no-such-flag"])  # Hydra's to say


def test_the_geotiff_nodata_found_is_printed_per_image_with_the_qualifying_windows(tmp_path):
    from tests.helpers.valid_maps import tagged_border_dataset

    root, out = tmp_path / "data", tmp_path / "out"
    tagged_border_dataset(root)
    done = _data(
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "datamodule.patch_size=32",
        "datamodule.sampling.min_valid=0.6",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout + done.stderr
    log = (out / "data.log").read_text(encoding="utf-8")
    for text in (printed, log):
        assert "no-data (each GeoTIFF's GDAL_NODATA tag; datamodule.sampling.nodata=null):" in text
        assert (
            "training images: 2 of 2 with a no-data value, 2 holding no-data pixels: 4,416" in text
        )
        assert "(of the training images, less their 4,416 no-data pixels)" in text
        assert "candidate windows of 32 px with datamodule.sampling.min_valid=0.6: " in text
        rows = [line.split() for line in text.splitlines() if "GDAL_NODATA  " in line]
        assert [row[:5] for row in rows[:2]] == [
            ["t1.tif", "0", "GDAL_NODATA", "1,760", "34.38%"],
            ["t2.tif", "0", "GDAL_NODATA", "2,656", "51.88%"],
        ]
        # t1: the 3 windows from column 0 hold 12 of 32 columns of data (< 0.6): 9 of 12 qualify.
        assert rows[0][5:] == ["9", "of", "12"] and rows[2][0] == "v1.tif"  # val: no windows
