"""Per-image metrics (MATLAB's ImageMetrics): the one-class tile docs/prediction.md shows."""

import numpy as np

from segscale.inference.image_metrics import ImageScores, image_row


def test_a_one_class_tile_with_a_few_stray_pixels_scores_its_mean_iou_as_matlab_does():
    # 1000 true pixels of class 0: 978 predicted so, 22 spread over classes 1-4.
    confusion = np.zeros((6, 6), np.int64)
    confusion[0, :5] = [978, 6, 6, 5, 5]
    row = image_row(ImageScores(0, "tile.png", confusion, None), list("abcdef"))
    name, accuracy, mean_accuracy, mean_iou, weighted_iou, bf = row
    assert (name, accuracy, mean_accuracy, weighted_iou, bf) == (
        "tile.png",
        0.978,
        0.978,
        0.978,
        "",
    )
    # Over the 5 classes in the truth or the prediction; class 5, in neither, is left out.
    assert mean_iou == round(0.978 / 5, 6) == 0.1956
