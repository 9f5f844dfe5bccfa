"""Datasets laid out as distributed train and evaluate, through the command line.

CamVid: ``train/``, ``trainannot/``, ... and ``train.txt`` listing SegNet's paths
(``/SegNet/CamVid/train/a.png /SegNet/CamVid/trainannot/a.png``). Cityscapes:
``leftImg8bit/<split>/<city>/<frame>_leftImg8bit.png`` ↔
``gtFine/<split>/<city>/<frame>_gtFine_labelIds.png``, beside other ``gtFine_*`` files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from segscale.cli.train import main as train_main
from segscale.data.synthetic import draw_tile
from segscale.errors import EXIT_BAD_INPUT
from segscale.inference.checkpoint_evaluation import evaluate
from tests.conftest import compose_config, oracle_checkpoint, oracle_image
from tests.in_process import run_in_process

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
