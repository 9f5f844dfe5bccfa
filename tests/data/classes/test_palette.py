import numpy as np
import pytest

from segscale.data.classes.labels import class_colours
from segscale.data.classes.palette import (
    GUARANTEED_CLASSES,
    MIN_DELTA_E,
    RESERVED,
    delta_e,
    srgb_to_lab,
    warn_indistinct,
)

CAMVID = [
    "Sky",
    "Building",
    "Pole",
    "Road",
    "Pavement",
    "Tree",
    "SignSymbol",
    "Fence",
    "Car",
    "Pedestrian",
    "Bicyclist",
    "Unlabelled",
]


def _least_distance(colours):
    distances = delta_e(colours, colours)
    np.fill_diagonal(distances, np.inf)
    return distances.min()


def test_lab_of_known_colours():
    # Reference values (D65): white L=100, black 0, sRGB red (53.24, 80.09, 67.20).
    lab = srgb_to_lab(np.array([[255, 255, 255], [0, 0, 0], [255, 0, 0]]))
    np.testing.assert_allclose(lab, [[100, 0, 0], [0, 0, 0], [53.24, 80.09, 67.20]], atol=0.1)


@pytest.mark.parametrize("count", [2, 12, 23, GUARANTEED_CLASSES])
def test_automatic_colours_keep_the_promised_distance(count):
    colours = class_colours(None, count)
    assert _least_distance(colours) >= MIN_DELTA_E
    assert delta_e(colours, np.array(RESERVED)).min() >= MIN_DELTA_E
    assert np.array_equal(colours, class_colours(None, count))  # deterministic


def test_camvid_classes_get_distinct_colours():
    # CamVid as distributed has index masks and no colours: all twelve are automatic.
    # The old palette gave SignSymbol (255,128,0) and Pedestrian (255,127,14).
    assert _least_distance(class_colours(None, len(CAMVID))) >= MIN_DELTA_E


def test_filled_colours_are_distinct_from_the_given_ones():
    given = [[128, 128, 128], [128, 0, 0], [192, 192, 128], [128, 64, 128]]  # CamVid's
    colours = class_colours(given, len(CAMVID))
    assert colours[: len(given)].tolist() == given  # given colours stay as given
    assert delta_e(colours[len(given) :], np.array(given)).min() >= MIN_DELTA_E
    assert _least_distance(colours[len(given) :]) >= MIN_DELTA_E


def test_many_classes_still_get_different_colours():
    colours = class_colours(None, 256)
    assert len({tuple(c) for c in colours.tolist()}) == 256


def test_indistinct_given_colours_warn_by_name():
    with pytest.warns(UserWarning, match="SignSymbol .* Pedestrian"):
        warn_indistinct(
            [[0, 0, 255], [255, 128, 0], [255, 127, 14]], ["Tree", "SignSymbol", "Pedestrian"]
        )
