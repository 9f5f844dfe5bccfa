import numpy as np
import pytest

from segscale.data.labels import LabelMap
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
    ],
)
def test_bad_label_ids_name_the_key(label_ids, ignore_ids, message):
    with pytest.raises(ConfigError, match=message) as error:
        LabelMap(3, 255, label_ids, ignore_ids)
    assert "datamodule." in str(error.value)
