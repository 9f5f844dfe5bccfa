"""Figures a person reads at a glance: the training-progress plot."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt


def save_figure(figure: plt.Figure, path: Path) -> None:
    """Write ``figure`` to ``path`` atomically (a reader never sees half a PNG)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.tmp{path.suffix}")
    figure.savefig(temporary, dpi=100, bbox_inches="tight")
    plt.close(figure)
    os.replace(temporary, path)


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
