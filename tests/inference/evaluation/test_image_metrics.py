"""Per-image metrics (MATLAB's ImageMetrics): the one-class tile docs/prediction.md shows."""

from pathlib import Path

import numpy as np

from segscale.inference.evaluation.image_metrics import (
    ImageScores,
    image_names,
    image_row,
    read_image_metrics,
    write_image_metrics,
)


def test_a_one_class_tile_with_a_few_stray_pixels_scores_its_mean_iou_as_matlab_does():
    # 1000 true pixels of class 0: 978 predicted so, 22 spread over classes 1-4.
    confusion = np.zeros((6, 6), np.int64)
    confusion[0, :5] = [978, 6, 6, 5, 5]
    row = image_row(ImageScores(0, confusion, None), "tile.png", list("abcdef"))
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


def test_images_are_named_by_file_where_names_are_unique():
    images = [Path("/data/val/images/a.png"), Path("/data/val/images/b.png")]
    assert image_names(images) == ["a.png", "b.png"]


def test_repeated_file_names_are_named_by_their_path_under_the_common_folder(tmp_path):
    # The Dubai set as distributed: every "Tile N/images" folder holds image_part_001.jpg.
    images = [
        Path("/data/Semantic segmentation dataset/Tile 1/images/image_part_001.jpg"),
        Path("/data/Semantic segmentation dataset/Tile 3/images/image_part_001.jpg"),
        Path("/data/Semantic segmentation dataset/Tile 3/images/image_part_002.jpg"),
    ]
    names = image_names(images)
    assert names == [
        "Tile 1/images/image_part_001.jpg",
        "Tile 3/images/image_part_001.jpg",
        "Tile 3/images/image_part_002.jpg",
    ]
    # Each row of image_metrics.csv keeps its image's name, in the split's order.
    confusion = np.eye(2, dtype=np.int64)
    scores = [ImageScores(place, confusion, None) for place in (2, 0, 1)]  # as ranks return
    write_image_metrics(tmp_path, scores, names, ["a", "b"])
    assert [row["image"] for row in read_image_metrics(tmp_path)] == names
