import numpy as np
import pytest

from segscale.data.classes.labels import LabelMap
from segscale.errors import ConfigError


def test_class_index_masks_decode_to_themselves_and_unknown_values_are_found():
    labels = LabelMap(3, ignore_index=255)
    raw = np.array([[0, 1, 2], [255, 7, 1]], np.uint8)
    assert labels.is_identity(raw)
    assert labels.decode(raw).tolist() == [[0, 1, 2], [255, 255, 1]]
    assert labels.unknown(np.unique(labels.codes(raw))) == [7]


def test_rgb_palette_masks_map_to_class_indices():
    colours = [[255, 255, 255], [0, 0, 255], [0, 255, 0]]
    labels = LabelMap(3, ignore_index=255, label_ids=colours, ignore_ids=[[0, 0, 0]])
    raw = np.array([[[0, 0, 255], [255, 255, 255]], [[0, 255, 0], [0, 0, 0]]], np.uint8)
    assert labels.channels == 3 and not labels.is_identity(raw)
    assert labels.decode(raw).tolist() == [[1, 0], [2, 255]]
    odd = np.array([[[1, 2, 3]]], np.uint8)
    assert labels.unknown(np.unique(labels.codes(odd))) == [(1, 2, 3)]


def test_colour_labels_read_a_palette_mask_by_its_colours_others_by_index():
    colours = [[255, 255, 255], [0, 0, 255], [0, 255, 0]]
    labels = LabelMap(3, ignore_index=255, label_ids=colours, ignore_ids=[[0, 0, 0]])
    # two files, one set of colours in two orders, an unknown colour, a void one
    first = np.array([[0, 0, 255], [255, 255, 255], [0, 255, 0], [9, 9, 9]], np.uint8)
    second = np.array([[0, 255, 0], [0, 0, 0], [0, 0, 255], [255, 255, 255]], np.uint8)
    indices = np.array([[0, 1, 2, 3, 4]], np.uint8)  # index 4: beyond either palette
    assert labels.decode(indices, labels.palette_table(first)).tolist() == [[1, 0, 2, 255, 255]]
    assert labels.decode(indices, labels.palette_table(second)).tolist() == [[2, 255, 1, 0, 255]]
    assert labels.palette_table(first).shape == (256,)
    # class indices and grey levels read it by index: no table, as any one-channel mask
    assert LabelMap(3).palette_table(first) is None
    assert LabelMap(2, 255, label_ids=[0, 3]).palette_table(first) is None
    assert labels.palette_table(None) is None


def test_grey_level_label_ids_and_several_ids_per_class():
    labels = LabelMap(2, ignore_index=254, label_ids=[0, [128, 255]])
    raw = np.array([[0, 128, 255, 3]], np.uint8)
    assert labels.decode(raw).tolist() == [[0, 1, 1, 254]]


@pytest.mark.parametrize(
    ("label_ids", "ignore_ids", "message"),
    [
        ([0, 1], (), "has 2 entries for 3 classes"),
        ([0, 1, 1], (), "given for two classes"),
        ([0, 1, [0, 0, 255]], (), "mix grey levels and RGB"),
        ([[0, 0, 300], [0, 0, 1], [0, 0, 2]], (), "not an RGB triplet"),
        # values of another kind: a string recursed without end, a float raised TypeError
        (None, ["x"], r"datamodule.ignore_ids: 'x' is not a mask value"),
        (["road", 1, 2], (), r"datamodule.label_ids: 'road' is not a mask value"),
        ([0, 1.5, 2], (), r"datamodule.label_ids: 1.5 is not a mask value"),
        (None, [True], r"datamodule.ignore_ids: True is not a mask value"),
        (None, [{"a": 1}], r"datamodule.ignore_ids: \{'a': 1\} is not a mask value"),
    ],
)
def test_bad_label_ids_name_the_key(label_ids, ignore_ids, message):
    with pytest.raises(ConfigError, match=message) as error:
        LabelMap(3, 255, label_ids, ignore_ids)
    assert "datamodule." in str(error.value)


def test_automatic_colours_are_neither_the_ignored_grey_nor_the_white_background():
    from segscale.data.classes.labels import automatic_palette, class_colours
    from segscale.training.reporting.plots import IGNORED_COLOUR

    count = len(automatic_palette())
    assert count >= 20
    colours = class_colours(None, count).astype(int)
    assert len({tuple(c) for c in colours}) == count  # as many distinct colours
    spread = colours.max(axis=1) - colours.min(axis=1)
    assert spread.min() >= 60  # no white, black or grey: class_0 was white, class_8 grey
    distance = np.abs(colours - np.asarray(IGNORED_COLOUR)).sum(axis=1)
    assert distance.min() > 60
    assert class_colours([[1, 2, 3], [4, 5, 6]], 2).tolist() == [[1, 2, 3], [4, 5, 6]]
