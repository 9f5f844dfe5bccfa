"""Figures a person reads at a glance: training progress, confusion matrix, predictions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.patches
import numpy as np

from segscale.atomic_files import write_atomically

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt


def save_figure(figure: plt.Figure, path: Path) -> None:
    """Write ``figure`` to ``path`` atomically (a reader never sees half a PNG)."""
    try:
        write_atomically(
            path,
            lambda stream: figure.savefig(
                stream, format=path.suffix[1:], dpi=100, bbox_inches="tight"
            ),
        )
    finally:
        plt.close(figure)


def plot_training_progress(
    train: Sequence[tuple[int, float, float, float]],
    val: Sequence[tuple[int, float, float, float]],
    path: Path,
) -> None:
    """MATLAB's training-progress figure: loss, accuracy, mIoU and learning rate.

    ``train`` rows are ``(iteration, loss, accuracy, learning rate)``; ``val`` rows are
    ``(iteration, loss, accuracy, mIoU)``.
    """
    figure, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    (loss_axis, acc_axis), (miou_axis, lr_axis) = axes
    if train:
        steps, loss, acc, lr = zip(*train, strict=True)
        loss_axis.plot(steps, loss, color="tab:orange", alpha=0.6, label="training (mini-batch)")
        acc_axis.plot(steps, [100 * a for a in acc], color="tab:blue", alpha=0.6, label="training")
        lr_axis.plot(steps, lr, color="tab:purple")
    if val:
        steps, loss, acc, miou = zip(*val, strict=True)
        style = {"color": "black", "marker": "o", "linestyle": "--", "markersize": 4}
        loss_axis.plot(steps, loss, label="validation", **style)
        acc_axis.plot(steps, [100 * a for a in acc], label="validation", **style)
        miou_axis.plot(steps, miou, **style)
    for axis, title in (
        (loss_axis, "Loss"),
        (acc_axis, "Pixel accuracy (%)"),
        (miou_axis, "Validation mean IoU"),
        (lr_axis, "Learning rate"),
    ):
        axis.set_title(title)
        axis.grid(alpha=0.3)
    loss_axis.legend()
    acc_axis.legend()
    for axis in (miou_axis, lr_axis):
        axis.set_xlabel("Iteration")
    figure.suptitle(f"Training progress — iteration {train[-1][0] if train else 0}")
    save_figure(figure, path)


def plot_confusion_matrix(confusion: np.ndarray, class_names: Sequence[str], path: Path) -> None:
    """A heatmap of the confusion matrix, each row normalized to the class's pixels."""
    counts = confusion.astype(float)
    rows = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    size = max(5.0, 0.9 * len(class_names) + 2)
    figure, axis = plt.subplots(figsize=(size + 1, size))
    image = axis.imshow(rows, cmap="Blues", vmin=0, vmax=1)
    for (i, j), value in np.ndenumerate(rows):
        colour = "white" if value > 0.6 else "black"
        axis.text(j, i, f"{100 * value:.1f}", ha="center", va="center", color=colour, fontsize=8)
    ticks = range(len(class_names))
    axis.set_xticks(ticks, class_names, rotation=45, ha="right")
    axis.set_yticks(ticks, class_names)
    axis.set_xlabel("Predicted class")
    axis.set_ylabel("True class")
    axis.set_title("Confusion matrix (% of each true class's pixels)")
    figure.colorbar(image, ax=axis, fraction=0.046)
    save_figure(figure, path)


def plot_sample_predictions(
    images: Sequence[np.ndarray],
    truths: Sequence[np.ndarray],
    predictions: Sequence[np.ndarray],
    class_names: Sequence[str],
    colours: np.ndarray,
    ignore_index: int,
    path: Path,
) -> None:
    """Image, ground truth and prediction side by side, with a class-colour legend."""
    rows = len(images)
    figure, axes = plt.subplots(rows, 3, figsize=(9, 3 * rows + 0.8), squeeze=False)
    palette = np.zeros((256, 3), np.uint8)
    palette[: len(colours)] = colours
    palette[ignore_index] = (0, 0, 0)
    for row, (image, truth, prediction) in enumerate(zip(images, truths, predictions, strict=True)):
        shown = image[:, :, :3] if image.shape[2] >= 3 else image[:, :, 0]
        for column, (picture, title) in enumerate(
            (
                (shown, "Image"),
                (palette[truth], "Ground truth"),
                (palette[prediction], "Prediction"),
            )
        ):
            axes[row, column].imshow(picture, cmap="gray" if picture.ndim == 2 else None)
            axes[row, column].set_axis_off()
            if row == 0:
                axes[row, column].set_title(title)
    handles = [
        # An RGB array is a colour to matplotlib; its ColorType names only tuples and str.
        matplotlib.patches.Patch(
            facecolor=np.asarray(c) / 255,  # type: ignore[arg-type]
            edgecolor="black",
            label=n,
        )
        for c, n in zip(colours, class_names, strict=True)
    ]  # outlined, so that white classes show on the white page
    handles.append(matplotlib.patches.Patch(facecolor="black", edgecolor="black", label="ignored"))
    figure.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), frameon=False)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    save_figure(figure, path)
