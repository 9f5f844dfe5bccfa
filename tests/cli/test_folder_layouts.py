"""Datasets laid out as distributed train and evaluate, through the command line.

CamVid: ``train/``, ``trainannot/``, ... and ``train.txt`` listing SegNet's paths
(``/SegNet/CamVid/train/a.png /SegNet/CamVid/trainannot/a.png``). Cityscapes:
``leftImg8bit/<split>/<city>/<frame>_leftImg8bit.png`` ↔
``gtFine/<split>/<city>/<frame>_gtFine_labelIds.png``, beside other ``gtFine_*`` files.
The Dubai aerial set: ``Tile N/images/image_part_00M.jpg`` ↔ ``Tile N/masks/...png``, RGB
and palette masks, walked from data.py to predict.py by the commands of docs/own-data.md.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import rasterio
from PIL import Image
from rasterio.transform import Affine

from segscale.cli.data import main as data_main
from segscale.cli.predict import main as predict_main
from segscale.cli.train import main as train_main
from segscale.data.datasets.synthetic import draw_tile
from segscale.errors import EXIT_BAD_INPUT
from segscale.inference.evaluation.run import evaluate
from tests.conftest import REPO, compose_config, oracle_checkpoint, oracle_image
from tests.helpers.in_process import run_in_process
from tests.helpers.palette_files import DUBAI, UNLABELLED, write_palette_mask

SIZE = 64


def _write(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def _camvid(root: Path, lists: bool = True) -> Path:
    """A CamVid-like tree: a tile per split (two for train), masks in ``<split>annot``."""
    for split, count, first in (("train", 2, 0), ("val", 1, 10), ("test", 1, 20)):
        lines = []
        for i in range(count):
            image, mask = draw_tile(SIZE, seed=0, index=first + i)
            _write(root / split / f"0001TP_{i:06}.png", image)
            _write(root / f"{split}annot" / f"0001TP_{i:06}.png", mask)
            lines.append(
                f"/SegNet/CamVid/{split}/0001TP_{i:06}.png "
                f"/SegNet/CamVid/{split}annot/0001TP_{i:06}.png"
            )
        if lists:
            (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def _cityscapes(root: Path) -> Path:
    """A Cityscapes-like tree: city subfolders, name suffixes, colour masks beside."""
    for split, cities in (("train", ("aachen", "bonn")), ("val", ("lindau",))):
        for i, city in enumerate(cities):
            image, mask = draw_tile(SIZE, seed=1, index=i + 10 * (split == "val"))
            frame = f"{city}_000000_0000{i}"
            _write(root / "leftImg8bit" / split / city / f"{frame}_leftImg8bit.png", image)
            _write(root / "gtFine" / split / city / f"{frame}_gtFine_labelIds.png", mask)
            _write(root / "gtFine" / split / city / f"{frame}_gtFine_color.png", image)
    return root


def _train(root: Path, run: Path, *overrides: str):
    return run_in_process(
        train_main,
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "datamodule.patch_size=32",
        "datamodule.patches_per_image=2",
        "datamodule.batch_size=2",
        "datamodule.val_batch_size=2",
        "datamodule.num_workers=0",
        "trainer.max_epochs=1",
        "trainer.accelerator=cpu",
        f"output_dir={run}",
        f"hydra.run.dir={run}",
        *overrides,
        cwd=run.parent,
    )


def test_camvid_as_distributed_trains_with_its_root_alone(tmp_path: Path, monkeypatch):
    # train/ holds no images/ and masks/: the split is train.txt, its paths SegNet's.
    root = _camvid(tmp_path / "CamVid")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    done = _train(root, tmp_path / "run")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 2
    # The validation pass cached what it read, in the user's cache, not the dataset.
    assert list((tmp_path / "cache/segscale/validation").glob("*.json"))
    assert not (root / ".segscale").exists()


def test_a_cityscapes_like_tree_trains_with_suffixes_and_classes_found(tmp_path: Path):
    root = _cityscapes(tmp_path / "cityscapes")
    done = _train(
        root,
        tmp_path / "run",
        "datamodule/classes=auto",
        "datamodule.source.splits.train={images:leftImg8bit/train,masks:gtFine/train}",
        "datamodule.source.splits.val={images:leftImg8bit/val,masks:gtFine/val}",
        "datamodule.source.image_suffix=_leftImg8bit",
        "datamodule.source.mask_suffix=_gtFine_labelIds",
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 2
    assert (tmp_path / "run/classes.yaml").is_file()


def test_evaluate_reads_the_test_split_of_separate_folders(tmp_path: Path):
    root = tmp_path / "CamVid"
    for name in ("a", "b"):
        mask = np.random.default_rng(len(name)).integers(0, 3, (24, 30)).astype(np.uint8)
        _write(root / "test" / f"{name}.png", oracle_image(mask))
        _write(root / "testannot" / f"{name}.png", mask)
    cfg = compose_config(
        "evaluate",
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "datamodule.source.splits.test={images:test,masks:testannot}",
        "other_data=true",  # not the oracle's
        f"ckpt={oracle_checkpoint(tmp_path / 'oracle.ckpt')}",
        f"output_dir={tmp_path / 'out'}",
        "accelerator=cpu",
        "inference.tile_size=32",
        "split=test",
    )
    assert evaluate(cfg)["MeanIoU"] == 1.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["datamodule.source.splits.train=[train,trainannot]"],
            "datamodule.source.splits.train=['train', 'trainannot'] is not allowed: expected "
            "one of: datamodule.source.splits.train=train (a folder under",
        ),
        (
            ["datamodule.source.splits.train={images:train}"],
            "datamodule.source.splits.train={'images': 'train'} is not allowed (it needs "
            "images and masks)",
        ),
        (
            ["datamodule.source.splits.train={images:train,masks:annot}"],
            "datamodule.source.splits.train.masks='annot': {root}/annot is not a folder; "
            "expected the split's mask folder under datamodule.source.root=",
        ),
        (  # the user's case: the folder exists, without images/ and masks/, and no list
            [],
            "datamodule.source.splits.train='train': the folder {root}/train has no images/ "
            "and no masks/ subfolder",
        ),
        (["datamodule.source.image_suffix=[a]"], "datamodule.source.image_suffix=['a'] is not"),
    ],
    ids=["list", "images-alone", "missing-masks-folder", "no-images-subfolder", "suffix-list"],
)
def test_a_split_of_the_wrong_form_or_not_there_is_one_line_exit_2(
    tmp_path: Path, overrides: list[str], message: str
):
    root = _camvid(tmp_path / "CamVid", lists=False)
    done = _train(root, tmp_path / "run", *overrides)
    output = done.stdout + done.stderr
    assert done.returncode == EXIT_BAD_INPUT, output[-3000:]
    assert "Traceback" not in output
    assert message.replace("{root}", str(root)) in output


WALK = "## Tiles as distributed: a tree of folders (the Dubai aerial set)"
DOCS_ROOT = "/data/Semantic segmentation dataset"
DOCS_GEOTIFF = "/data/geotiffs/image_part_001.tif"
TO_DUBAI = np.array([2, 0, 5, 3, 4, 1])
"""The synthetic tiles' classes as Dubai's: impervious → road, building, low vegetation →
unlabelled (its 6th colour), tree → vegetation, car → water, clutter → land."""


def _walk() -> str:
    page = (REPO / "docs/own-data.md").read_text()
    return page[page.index(WALK) :].split("\n## ", 1)[0]


def _fence(section: str, language: str, after: str = "") -> str:
    """The first ``language`` code block of ``section`` after the text ``after``."""
    text = section[section.index(after) :] if after else section
    found = re.search(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert found, f"no {language} block in the walk"
    return found.group(1)


def _dubai_as_distributed(root: Path) -> None:
    """Three tiles of two parts (80-200 px): JPEG images, RGB and palette PNG masks."""
    shapes = [(96, 128), (80, 200), (144, 112), (200, 160), (128, 128), (88, 104)]
    colours = [*DUBAI, UNLABELLED]
    for index, (height, width) in enumerate(shapes):
        tile, part = ("Tile 1", "Tile 2", "Tile 8")[index // 2], index % 2 + 1
        image, classes = draw_tile(max(height, width), seed=48, index=index)
        image, classes = image[:height, :width], TO_DUBAI[classes[:height, :width]]
        name = f"image_part_{part:03}"
        (root / tile / "images").mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(root / tile / "images" / f"{name}.jpg", quality=92)
        mask = root / tile / "masks" / f"{name}.png"
        if index % 2:  # a palette PNG, each file its own palette order
            order = np.random.default_rng(index).permutation(len(colours))
            write_palette_mask(mask, classes, colours, order=order)
        else:
            _write(mask, np.array(colours, np.uint8)[classes])


@pytest.mark.slow
def test_the_dubai_layout_as_distributed_walks_from_its_tiles_to_a_geotiff(tmp_path: Path):
    # The commands of docs/own-data.md's walk, as written, on a generated copy of the
    # layout; only the paths of the docs are this test's, and the tiny-run overrides.
    section = _walk()
    root = tmp_path / "data/Semantic segmentation dataset"
    _dubai_as_distributed(root)
    (root / "val.txt").write_text(_fence(section, "text", "`val.txt`"))
    classes = tmp_path / "myconf/datamodule/classes/dubai.yaml"
    classes.parent.mkdir(parents=True)
    classes.write_text(_fence(section, "yaml"))
    geotiff = tmp_path / "geotiffs/image_part_001.tif"  # Tile 8's first part, georeferenced
    pixels = np.asarray(Image.open(root / "Tile 8/images/image_part_001.jpg"))
    geotiff.parent.mkdir()
    profile = {"driver": "GTiff", "width": 128, "height": 128, "count": 3, "dtype": "uint8"}
    transform = Affine(0.5, 0.0, 302000.0, 0.0, -0.5, 2785000.0)  # UTM 40N, 0.5 m
    with rasterio.open(geotiff, "w", crs="EPSG:32640", transform=transform, **profile) as out:
        out.write(np.moveaxis(pixels, -1, 0))
    tiny = re.search(r"tiny-run overrides\s+`([^`]+)`", section)
    assert tiny, "the walk names no tiny-run overrides"
    script = _fence(section, "bash", "runs these commands").replace("\\\n", " ")
    work = tmp_path / "work"
    work.mkdir()
    programs = {"data.py": data_main, "train.py": train_main, "predict.py": predict_main}
    outputs = {}
    for line in script.splitlines():
        words = shlex.split(line.replace("~/myconf", str(tmp_path / "myconf")))
        words = [w.replace(DOCS_ROOT, str(root)).replace(DOCS_GEOTIFF, str(geotiff)) for w in words]
        assert words[0] == "python" and words[1] in programs, line
        if words[1] != "predict.py":  # data.py takes the datamodule's alone
            words += [
                o
                for o in tiny.group(1).split()
                if words[1] == "train.py" or o.startswith("datamodule.")
            ]
        if words[1] == "predict.py":
            (run,) = (work / "outputs/aerial").iterdir()  # where the docs say the run is
            words = [w.replace("<run>", run.name) for w in words]
        done = run_in_process(programs[words[1]], *words[2:], cwd=work, program=words[1])
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{line}\n{output[-4000:]}"
        assert "Traceback" not in output
        outputs[words[1]] = output
    checked = outputs["data.py"]
    # The keys of the tree: Tile 8 held out whole, the same names in every tile paired.
    assert "images: 4 training, 2 validation" in checked
    assert "palette mask(s) read by their palettes' colours" in checked
    assert re.search(r"ignore_ids \[\[155, 155, 155\]\]: [\d,]+ px, [\d.]+% of training", checked)
    assert re.search(r"written to \S.*outputs/data/\S+: class_frequencies.csv", checked)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished"
    (predicted,) = (work / "outputs/predict").glob("*/image_part_001.tif")
    with rasterio.open(geotiff) as given, rasterio.open(predicted) as mask:
        assert mask.crs == given.crs and mask.transform == given.transform
        assert mask.count == 1 and int(mask.read(1).max()) < len(DUBAI)
