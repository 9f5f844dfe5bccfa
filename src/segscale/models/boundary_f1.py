"""Boundary F1 (BF) score of one image, per class: MATLAB's ``bfscore`` (Csurka et al. 2013).

A class's boundary is the perimeter of its pixels (a pixel of the class with a
4-neighbour outside it, or on the image's edge: MATLAB's ``bwperim``). Precision is the
share of predicted boundary pixels within ``θ`` (Euclidean distance ``≤ θ``) of a true
boundary pixel, recall the converse, and BF = 2PR / (P + R). ``θ`` is a fraction of the
image's diagonal, as in MATLAB (``0.0075``: 0.75 %).
"""

from __future__ import annotations

import math

import cv2
import numpy as np

# OpenCV (albumentations' own dependency) rather than scipy.ndimage: its erosion and
# distance transform are about ten times faster, and a large image's classes each need
# two transforms.
_CROSS = cv2.getStructuringElement(cv2.MORPH_CROSS, (3, 3))
"""4-connectivity: a pixel's neighbours above, below, left and right."""


def tolerance_pixels(fraction: float, shape: tuple[int, int]) -> float:
    """The distance tolerance ``θ`` in pixels: ``fraction`` of the image's diagonal."""
    return fraction * math.hypot(*shape)


def boundary(region: np.ndarray) -> np.ndarray:
    """The perimeter pixels of a boolean ``region`` (the image's edge counts as outside)."""
    inside = cv2.erode(region.view(np.uint8), _CROSS, borderType=cv2.BORDER_CONSTANT, borderValue=0)
    return region & (inside == 0)


def boundary_f1(
    truth: np.ndarray, predicted: np.ndarray, num_classes: int, fraction: float
) -> np.ndarray:
    """BF score of each class of one image; NaN where the class is in neither map.

    ``truth``: class indices, values ``≥ num_classes`` ignored (the ignore index):
    those pixels belong to no class in either map, so a prediction there is neither
    right nor wrong. A class in only one of the maps scores 0.
    """
    labelled = truth < num_classes
    theta = tolerance_pixels(fraction, truth.shape)
    scores = np.full(num_classes, np.nan)
    for c in range(num_classes):
        true_edge = boundary(truth == c)
        predicted_edge = boundary((predicted == c) & labelled)
        if true_edge.any() or predicted_edge.any():
            scores[c] = _f1(true_edge, predicted_edge, theta)
    return scores


def _f1(true_edge: np.ndarray, predicted_edge: np.ndarray, theta: float) -> float:
    if not (true_edge.any() and predicted_edge.any()):
        return 0.0
    # Only the boxes around the edges (widened by θ) can hold a match: the distance
    # transforms of a large image's small objects stay small.
    rows, cols = np.nonzero(true_edge | predicted_edge)
    pad = math.ceil(theta) + 1
    box = (
        slice(max(rows.min() - pad, 0), rows.max() + pad + 1),
        slice(max(cols.min() - pad, 0), cols.max() + pad + 1),
    )
    true_edge, predicted_edge = true_edge[box], predicted_edge[box]
    near_truth = _distance_to(true_edge) <= theta
    near_prediction = _distance_to(predicted_edge) <= theta
    precision = near_truth[predicted_edge].mean()
    recall = near_prediction[true_edge].mean()
    if precision + recall == 0:
        return 0.0
    return float(2 * precision * recall / (precision + recall))


def _distance_to(edge: np.ndarray) -> np.ndarray:
    """Each pixel's Euclidean distance to the nearest ``edge`` pixel (exact: MASK_PRECISE)."""
    return cv2.distanceTransform((~edge).view(np.uint8), cv2.DIST_L2, cv2.DIST_MASK_PRECISE)
