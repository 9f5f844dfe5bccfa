"""Segmentation metrics from a confusion matrix, named as MATLAB names them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def scores_from_confusion(confusion: torch.Tensor) -> dict[str, torch.Tensor]:
    """Pixel accuracy, per-class IoU and mean IoU from a (true × predicted) pixel count.

    Mean IoU averages over the classes that occur in the target or the prediction;
    a class absent from both has no IoU (NaN) and does not pull the mean down.
    """
    confusion = confusion.double()
    true_positive = confusion.diag()
    union = confusion.sum(0) + confusion.sum(1) - true_positive
    iou = torch.where(union > 0, true_positive / union.clamp(min=1), torch.nan)
    return {
        "acc": true_positive.sum() / confusion.sum().clamp(min=1),
        "mIoU": iou.nanmean(),
        "iou": iou,
    }


def evaluation_report(
    confusion: torch.Tensor,
    class_names: Sequence[str],
    boundary_f1: Sequence[float | None] | None = None,
    mean_boundary_f1: float | None = None,
    bf_tolerance: float | None = None,
) -> dict[str, Any]:
    """The data-set and per-class metrics of MATLAB's ``evaluateSemanticSegmentation``.

    Data set: ``GlobalAccuracy`` (correct pixels / pixels), ``MeanAccuracy`` (mean of
    per-class recall), ``MeanIoU``, ``WeightedIoU`` (IoU weighted by each class's share
    of the ground-truth pixels) and ``MeanDice``. Per class: ``Accuracy`` (recall),
    ``IoU`` and ``Dice``; a class absent from ground truth and prediction gets ``None``.
    ``boundary_f1`` (one per class) and ``mean_boundary_f1``, where the boundary F1
    score was measured, add ``MeanBFScore`` to the classes and the data set, and
    ``bf_tolerance`` (its tolerance, a fraction of the image diagonal) to the report.
    """
    confusion = confusion.double().cpu()
    scores = scores_from_confusion(confusion)
    iou, true_positive = scores["iou"], confusion.diag()
    truth = confusion.sum(1)
    # Dice = 2·IoU / (1 + IoU), defined wherever IoU is.
    dice = 2 * iou / (1 + iou)
    recall = torch.where(truth > 0, true_positive / truth.clamp(min=1), torch.nan)
    share = truth / truth.sum().clamp(min=1)

    def number(value: torch.Tensor) -> float | None:
        return None if torch.isnan(value) else round(float(value), 6)

    report: dict[str, Any] = {
        "GlobalAccuracy": number(scores["acc"]),
        "MeanAccuracy": number(recall.nanmean()),
        "MeanIoU": number(scores["mIoU"]),
        "WeightedIoU": number((share * iou.nan_to_num()).sum()),
        "MeanDice": number(dice.nanmean()),
        "classes": {
            name: {"Accuracy": number(recall[c]), "IoU": number(iou[c]), "Dice": number(dice[c])}
            for c, name in enumerate(class_names)
        },
    }
    if boundary_f1 is not None:
        report["MeanBFScore"] = mean_boundary_f1
        report["bf_tolerance"] = bf_tolerance
        for name, score in zip(class_names, boundary_f1, strict=True):
            report["classes"][name]["MeanBFScore"] = score
    return report
