import math

import pytest
import torch

from segscale.models.metrics import evaluation_report, scores_from_confusion


def test_scores_from_confusion():
    confusion = torch.tensor([[3, 1, 0], [0, 2, 0], [0, 0, 0]])
    scores = scores_from_confusion(confusion)
    assert scores["acc"].item() == pytest.approx(5 / 6)
    assert scores["iou"][0].item() == pytest.approx(3 / 4)
    assert scores["iou"][1].item() == pytest.approx(2 / 3)
    assert math.isnan(scores["iou"][2].item())  # absent everywhere: not counted
    assert scores["mIoU"].item() == pytest.approx((3 / 4 + 2 / 3) / 2)


def test_evaluation_report_has_matlabs_columns():
    # rows: true class, columns: predicted
    confusion = torch.tensor([[8, 2, 0], [1, 3, 0], [0, 0, 0]])
    report = evaluation_report(confusion, ["a", "b", "c"])
    assert report["GlobalAccuracy"] == pytest.approx(11 / 14, abs=1e-6)
    assert report["MeanAccuracy"] == pytest.approx((8 / 10 + 3 / 4) / 2, abs=1e-6)
    iou_a, iou_b = 8 / 11, 3 / 6
    assert report["MeanIoU"] == pytest.approx((iou_a + iou_b) / 2, abs=1e-6)
    assert report["WeightedIoU"] == pytest.approx(10 / 14 * iou_a + 4 / 14 * iou_b, abs=1e-6)
    assert report["classes"]["a"]["Dice"] == pytest.approx(16 / 19, abs=1e-6)
    assert report["classes"]["b"]["Accuracy"] == pytest.approx(0.75)
    assert report["classes"]["c"] == {"Accuracy": None, "IoU": None, "Dice": None}
