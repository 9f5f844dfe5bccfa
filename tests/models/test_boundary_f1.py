import math

import numpy as np
import pytest

from segscale.models.boundary_f1 import boundary, boundary_f1, tolerance_pixels


def _squares() -> tuple[np.ndarray, np.ndarray]:
    """12×12: class 1 a 6×6 square at rows 2-7, cols 2-7 (truth), cols 4-9 (prediction)."""
    truth = np.zeros((12, 12), np.uint8)
    truth[2:8, 2:8] = 1
    predicted = np.zeros((12, 12), np.uint8)
    predicted[2:8, 4:10] = 1
    return truth, predicted


def test_a_square_s_boundary_is_its_perimeter_and_the_image_edge_counts():
    truth, _ = _squares()
    assert boundary(truth == 1).sum() == 20  # 6·4 − 4 corners counted twice
    # background: the image's edge (44 pixels) and the ring around the square (6·4)
    assert boundary(truth == 0).sum() == 44 + 24


def test_bf_score_of_a_square_shifted_by_two_pixels_as_computed_by_hand():
    truth, predicted = _squares()
    # θ = 0.07 · 12√2 = 1.19 px: a pixel matches one at distance 1, not √2.
    assert 1 <= tolerance_pixels(0.07, truth.shape) < math.sqrt(2)
    scores = boundary_f1(truth, predicted, 3, 0.07)
    # class 1, predicted edge (20 px): rows 2 and 7, cols 4-7 lie on the true edge (8),
    # col 8 is 1 px from (2,7)/(7,7) (2); (3,4) and (6,4) are 1 px below/above the true
    # rows 2 and 7 (2); col 9 and (4,4), (5,4) are 2 px or more away: P = 12/20. The
    # picture mirrored swaps the roles: R = 12/20, so BF = 0.6.
    assert scores[1] == pytest.approx(0.6)
    # class 0, predicted edge (68 px): the image's edge (44) matches exactly; its ring,
    # row 1 cols 4-9 (6: 1 px from the edge row 0), row 8 cols 4-8 (5; (8,9) is √2 from
    # the nearest, (7,8) of the true ring), col 3 rows 2 and 7 (2: next to
    # row 1 / row 8 of the true ring; rows 3-6 are 2 px from col 1), col 10 (6: next to
    # the edge col 11): P = 63/68; mirrored, R = 63/68 as well.
    assert scores[0] == pytest.approx(63 / 68)
    assert math.isnan(scores[2])  # in neither map: no score (MATLAB's NaN)


def test_without_tolerance_only_pixels_on_the_true_boundary_match():
    truth, predicted = _squares()
    # θ = 0.0075 · 12√2 = 0.13 px: the 8 shared pixels of rows 2 and 7 of class 1 (8/20);
    # class 0: the edge (44) and rows 1 and 8, cols 4-7 (8): 52/68.
    scores = boundary_f1(truth, predicted, 3, 0.0075)
    assert scores[1] == pytest.approx(0.4) and scores[0] == pytest.approx(52 / 68)


def test_a_class_in_one_map_only_scores_zero_and_ignored_pixels_are_no_class():
    truth, predicted = _squares()
    predicted[0, 0] = 2  # class 2 predicted, not true
    assert boundary_f1(truth, predicted, 3, 0.07)[2] == 0.0
    ignored = truth.copy()
    ignored[:, 6:] = 255  # the right half is not labelled: whatever is predicted there
    exact = np.where(ignored == 255, 0, ignored)  # ... does not count
    np.testing.assert_allclose(boundary_f1(ignored, exact, 3, 0.0075)[:2], [1.0, 1.0])
