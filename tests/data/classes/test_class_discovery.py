"""datamodule/classes=auto: the classes of the training masks, from arrays and from files."""

from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from segscale.data.checks import dataset_problems, validation_cache
from segscale.data.checks.dataset_problems import InvalidDatasetError
from segscale.data.checks.mask_value_scan import scan_mask_values
from segscale.data.checks.validation import validate_dataset
from segscale.data.classes.class_discovery import infer_classes
from segscale.data.classes.labels import LabelMap, class_colours, mask_codes
from segscale.data.classes.mask_values import MaskValueCensus
from segscale.data.datasets.folder import FolderTiles
from segscale.errors import ConfigError
from tests.conftest import write_pair

BLACK, RED, GREEN, BLUE = (0, 0, 0), (255, 0, 0), (0, 255, 0), (0, 0, 255)


def census_of(*masks: np.ndarray) -> MaskValueCensus:
    """The census ``scan_mask_values`` would take of ``masks`` (files m0.png, m1.png, ...)."""
    census = MaskValueCensus(colour=masks[0].ndim == 3)
    for i, mask in enumerate(masks):
        codes, counts = np.unique(mask_codes(mask), return_counts=True)
        census.add(Path(f"m{i}.png"), codes, counts)
    return census


def test_grey_masks_give_their_levels_less_void_values_and_the_ignore_index():
    first = np.array([[0, 3, 7, 255], [0, 0, 9, 9]], np.uint8)
    census = census_of(first, np.array([[0, 9, 3, 3]], np.uint8))
    found = infer_classes(census, ignore_index=255, ignore_ids=[9])
    assert found.label_ids == (0, 3, 7) and found.num_classes == 3
    assert found.class_names == ("class_0", "class_3", "class_7")
    assert found.pixels == (4, 3, 1) and found.files == (2, 2, 1)
    assert found.class_colors == tuple(map(tuple, class_colours(None, 3).tolist()))
    assert infer_classes(census, class_names=["a", "b", "c", "d"]).label_ids == (0, 3, 7, 9)
    with pytest.raises(ConfigError) as wrong:
        infer_classes(census, ignore_ids=[9], class_names=["road", "car"])
    assert "datamodule.class_names has 2 names ['road', 'car']" in str(wrong.value)
    assert "found 3 classes in the training masks (values 0, 3, 7)" in str(wrong.value)
    with pytest.raises(ConfigError, match="needs at least 2 classes"):
        infer_classes(census, ignore_ids=[3, 7, 9])


def test_rgb_masks_give_their_colours_and_a_void_colour_is_ignored():
    mask = np.array([[BLACK, RED], [GREEN, GREEN]], np.uint8)
    found = infer_classes(census_of(mask), ignore_ids=[list(BLACK)], class_colors=None)
    assert found.colour and found.label_ids == (GREEN, RED)  # ascending 0xRRGGBB
    assert found.class_names == ("class_0_255_0", "class_255_0_0")
    assert found.class_colors == (GREEN, RED)
    settings = OmegaConf.create(found.yaml("/data"))  # the file the run folder gets
    assert found.yaml("/data").startswith("# @package datamodule\n")
    assert OmegaConf.to_container(settings) == found.settings()
    assert settings.label_ids == [[0, 255, 0], [255, 0, 0]] and settings.ignore_ids == [[0, 0, 0]]
    with pytest.raises(ConfigError, match=r"ignore_ids=\[0\]: .* RGB colour masks"):
        infer_classes(census_of(mask), ignore_ids=[0])


def test_classes_from_files_and_a_val_value_no_training_mask_holds(tmp_path: Path, monkeypatch):
    def rgb(*colours):
        return np.array([colours] * 16, np.uint8).repeat(4, axis=1)  # 16x16 in stripes

    image = np.zeros((16, 16, 3), np.uint8)
    write_pair(tmp_path, "train", "t1", image, rgb(BLACK, RED, GREEN, RED))
    write_pair(tmp_path, "train", "t2", image, rgb(RED, RED, RED, RED))
    write_pair(tmp_path, "val", "v1", image, rgb(RED, BLUE, GREEN, BLACK))
    reads = []
    inspect = validation_cache.inspect_pair
    monkeypatch.setattr(
        validation_cache, "inspect_pair", lambda p, *a: reads.append(p) or inspect(p, *a)
    )
    source = FolderTiles(str(tmp_path))
    found = infer_classes(scan_mask_values(source), ignore_ids=[list(BLACK)])
    assert found.label_ids == (GREEN, RED) and found.pixels == (64, 384) and len(reads) == 2
    settings = found.settings()
    labels = LabelMap(2, 255, settings["label_ids"], settings["ignore_ids"])
    monkeypatch.setattr(dataset_problems, "_classes_option", lambda: "auto")
    with pytest.raises(InvalidDatasetError) as refused:
        validate_dataset(source, labels, found.class_names, 16, None)
    lines = str(refused.value).splitlines()
    assert lines[1].startswith("  1 mask(s) hold a value that datamodule/classes=auto does not")
    assert lines[3].split() == ["[0,", "0,", "255]", "64", "1", "v1.png"]
    assert "no training mask holds these values" in lines[4]
    assert "datamodule.ignore_ids=[[0, 0, 255]]" in lines[4]
    assert len(reads) == 3  # the training masks were read once, for both passes
    scan_mask_values(source)  # a second run (or another rank) reads nothing
    assert len(reads) == 3
