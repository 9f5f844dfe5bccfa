"""Figures a person reads at a glance: training progress and predictions.

The figures are built with matplotlib's object-oriented API (``Figure``), not pyplot's
global state, so that they can be drawn on a thread of their own
(``BackgroundFigures``), and sent to the metric trackers that show images
(``log_image``: TensorBoard, MLflow, W&B).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import matplotlib.axes
import matplotlib.patches
import matplotlib.ticker
import numpy as np
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from matplotlib.figure import Figure
from PIL import Image

from segscale.figure_files import save_figure

IGNORED_COLOUR = (200, 200, 200)
"""Fill of pixels that are not scored (the ignore index): a neutral light grey."""
IGNORED_HATCH = "////"
"""Drawn over ignored pixels too: a class may have the same grey, never the hatch."""
IGNORED_LABEL = "ignored (not scored)"


@dataclass(frozen=True)
class TrainingPosition:
    """Where training stands when a figure is drawn: optimizer steps and epochs (1-based).

    ``iterations`` and ``epochs`` are the planned totals (``None``: unknown).
    """

    iteration: int
    iterations: int | None = None
    epoch: int | None = None
    epochs: int | None = None

    def describe(self) -> str:
        """``"iteration 184 of 184, epoch 2 of 2"``, leaving out what is unknown."""
        parts = [_count("iteration", self.iteration, self.iterations)]
        if self.epoch is not None:
            parts.append(_count("epoch", self.epoch, self.epochs))
        return ", ".join(parts)


def _count(what: str, value: int, total: int | None) -> str:
    return f"{what} {value}" + (f" of {total}" if total else "")


def training_progress_figure(
    train: Sequence[tuple[int, float, float, float]],
    val: Sequence[tuple[int, float, float, float]],
    position: TrainingPosition | None = None,
    batch: str = "mini-batch",
) -> Figure:
    """MATLAB's training-progress figure: loss, accuracy, mIoU and learning rate.

    ``train`` rows are ``(iteration, loss, accuracy, learning rate)``, measured on
    ``batch`` (what the legend calls it); ``val`` rows are ``(iteration, loss,
    accuracy, mIoU)``. The title and the iteration axis end at ``position`` (default:
    the last row), which may lie past the last logged row.
    """
    figure = Figure(figsize=(11, 7))
    axes = figure.subplots(2, 2, sharex=True)
    (loss_axis, acc_axis), (miou_axis, lr_axis) = axes
    if train:
        steps, loss, acc, lr = zip(*train, strict=True)
        loss_axis.plot(steps, loss, color="tab:orange", alpha=0.6, label=f"training ({batch})")
        acc_axis.plot(
            steps, [100 * a for a in acc], color="tab:blue", alpha=0.6, label=f"training ({batch})"
        )
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
        (miou_axis, "Validation mean IoU (0-1)"),
        (lr_axis, "Learning rate"),
    ):
        axis.set_title(title)
        axis.grid(alpha=0.3)
    loss_axis.legend(fontsize="small")
    acc_axis.legend(fontsize="small")
    for axis in (miou_axis, lr_axis):
        axis.set_xlabel("Iteration")
    if position is None:
        position = TrainingPosition(max((row[0] for row in (*train, *val)), default=0))
    # The axis reaches the iteration the title names (the last one of a finished run),
    # with a margin so that a validation marker there is not cut in half.
    loss_axis.set_xlim(0, max(1.0, 1.03 * position.iteration))
    loss_axis.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    figure.suptitle(f"Training progress — {position.describe()}")
    return figure


def plot_training_progress(
    train: Sequence[tuple[int, float, float, float]],
    val: Sequence[tuple[int, float, float, float]],
    path: Path,
    position: TrainingPosition | None = None,
    batch: str = "mini-batch",
) -> None:
    """Write ``training_progress_figure`` to ``path``."""
    save_figure(training_progress_figure(train, val, position, batch), path)


@dataclass(frozen=True)
class SamplePrediction:
    """One row of the sample figure: an image, its ground truth and the prediction.

    ``image`` is H×W×3 uint8 RGB; ``truth`` and ``prediction`` are H×W class indices
    (``truth`` holds the ignore index where a pixel is not scored); ``caption`` says
    which image it is and at what scale it is shown.
    """

    image: np.ndarray
    truth: np.ndarray
    prediction: np.ndarray
    caption: str


def colour_labels(labels: np.ndarray, colours: np.ndarray, ignore_index: int) -> np.ndarray:
    """H×W×3 uint8 RGB of class indices; ``ignore_index`` in ``IGNORED_COLOUR``."""
    palette = np.zeros((max(256, ignore_index + 1), 3), np.uint8)
    palette[: len(colours)] = colours
    palette[ignore_index] = IGNORED_COLOUR
    return palette[labels]


def sample_predictions_figure(
    samples: Sequence[SamplePrediction],
    class_names: Sequence[str],
    colours: np.ndarray,
    ignore_index: int,
    title: str = "",
) -> Figure:
    """Image, ground truth and prediction side by side, one row per sample (at least one).

    Ignored pixels are grey and hatched in the ground truth, and hatched over the
    prediction (the network predicts them, but they are not scored).
    """
    figure = Figure(figsize=(12, 4 * len(samples) + 1.2), layout="constrained")
    rows = figure.subfigures(len(samples), 1, squeeze=False)[:, 0]  # an array, even of one
    any_ignored = False
    for subfigure, sample in zip(rows, samples, strict=True):
        subfigure.suptitle(sample.caption, fontsize=10)
        axes = subfigure.subplots(1, 3)
        ignored = sample.truth == ignore_index
        any_ignored |= bool(ignored.any())
        for axis, picture, heading in (
            (axes[0], sample.image, "Image"),
            (axes[1], colour_labels(sample.truth, colours, ignore_index), "Ground truth"),
            (axes[2], colour_labels(sample.prediction, colours, ignore_index), "Prediction"),
        ):
            # nearest: class colours must not blend into colours of no class
            axis.imshow(picture, interpolation="nearest")
            if axis is not axes[0]:
                _hatch(axis, ignored)
            axis.set_title(heading, fontsize=10)
            axis.set_axis_off()
    handles = [
        # An RGB array is a colour to matplotlib; its ColorType names only tuples and str.
        matplotlib.patches.Patch(
            facecolor=np.asarray(c) / 255,  # type: ignore[arg-type]
            edgecolor="black",
            label=n,
        )
        for c, n in zip(colours, class_names, strict=True)
    ]  # outlined, so that white classes show on the white page
    if any_ignored:
        handles.append(
            matplotlib.patches.Patch(
                facecolor=np.asarray(IGNORED_COLOUR) / 255,  # type: ignore[arg-type]
                edgecolor="black",
                hatch=IGNORED_HATCH,
                label=IGNORED_LABEL,
            )
        )
    figure.legend(
        handles=handles, loc="outside lower center", ncol=min(len(handles), 4), frameon=False
    )
    if title:
        figure.suptitle(title)
    return figure


def _hatch(axis: matplotlib.axes.Axes, ignored: np.ndarray) -> None:
    """Hatch the ignored pixels of an image shown on ``axis`` (drawn in screen space)."""
    if not ignored.any():
        return
    limits = axis.get_xlim(), axis.get_ylim()
    axis.contourf(
        ignored.astype(np.float32), levels=[0.5, 1.5], colors="none", hatches=[IGNORED_HATCH]
    )
    axis.set_xlim(limits[0])  # contourf would widen them to the pixel centres
    axis.set_ylim(limits[1])


def plot_sample_predictions(
    samples: Sequence[SamplePrediction],
    class_names: Sequence[str],
    colours: np.ndarray,
    ignore_index: int,
    path: Path,
    title: str = "",
) -> None:
    """Write ``sample_predictions_figure`` to ``path``."""
    save_figure(sample_predictions_figure(samples, class_names, colours, ignore_index, title), path)


log = logging.getLogger(__name__)


class BackgroundFigures:
    """Draws figures one at a time on a thread of its own; ``wait`` until all are written.

    A figure that fails to draw is logged as an error naming its file, and nothing
    else happens: a figure never costs the run its result. The thread is a daemon:
    a process that ends without ``wait`` (a crash, a kill) does not hang on it, and
    the file, written atomically, is then the previous one or none.
    """

    def __init__(self, name: str = "figures") -> None:
        self.name = name
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def draw(self, path: Path, write: Callable[[], None]) -> None:
        """Run ``write`` (which writes the figure at ``path``) on the drawing thread."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"segscale-{self.name}")
        future = self._executor.submit(write)
        future.add_done_callback(partial(_log_failure, path))
        self._pending = [f for f in self._pending if not f.done()] + [future]

    def wait(self) -> None:
        """Return once every figure asked for is written (or its failure logged)."""
        for future in self._pending:
            future.exception()  # waits; the failure is logged by _log_failure
        self._pending = []

    def close(self) -> None:
        """``wait``, then end the drawing thread."""
        self.wait()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def _log_failure(path: Path, future: Future[None]) -> None:
    if (error := future.exception()) is not None:
        log.error("could not draw %s: %s: %s", path, type(error).__name__, error)


TRACKER_DPI = 72
"""Resolution of a tracker image: a figure per validation, so kept small."""


def image_loggers(loggers: Sequence[Logger]) -> list[Logger]:
    """The loggers among ``loggers`` that can show an image."""
    return [
        logger
        for logger in loggers
        if isinstance(logger, TensorBoardLogger | MLFlowLogger | WandbLogger)
    ]


def render(figure: Figure) -> np.ndarray:
    """``figure`` as an H×W×3 uint8 RGB array."""
    stream = io.BytesIO()
    figure.savefig(stream, format="png", dpi=TRACKER_DPI, bbox_inches="tight")
    stream.seek(0)
    with Image.open(stream) as image:
        return np.asarray(image.convert("RGB"))


def log_image(loggers: Sequence[Logger], key: str, image: np.ndarray, step: int) -> None:
    """Send ``image`` (H×W×3 uint8) as ``key`` at ``step`` to each logger that shows images.

    MLflow keeps it as the artifact ``<key>/step_<step>.png`` (zero-padded, so that the
    files sort in order); TensorBoard and W&B show it at ``step`` under ``key``.
    """
    for logger in image_loggers(loggers):
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(key, image, global_step=step, dataformats="HWC")
        elif isinstance(logger, MLFlowLogger):
            # run_id is set once experiment has created the run
            client = logger.experiment
            client.log_image(logger.run_id, image, artifact_file=f"{key}/step_{step:07d}.png")
        elif isinstance(logger, WandbLogger):
            logger.log_image(key=key, images=[image], step=step)
