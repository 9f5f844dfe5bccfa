"""The Python API: ``segscale.load(ckpt).predict(image)`` and ``segscale.train(overrides)``.

Both do what the command line does, through the same pieces. ``load`` reads a
checkpoint as ``predict.py`` does and predicts with the sliding window of the shipped
``predict`` config (its ``inference`` group). ``train`` composes and checks the config
here, so that a bad override raises in the caller, then runs ``train.py`` itself
(``python -m segscale.cli.train``) in a child process: DDP ranks, logging and process
groups behave exactly as on the command line, and the caller's process (a notebook,
say) keeps no trace of the run. ``evaluate(ckpt, overrides)`` runs ``evaluate.py``'s
evaluation in the caller's process and returns its metrics and per-image rows.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Union, cast

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from segscale.command_line import TRAIN_COMMAND, quoted_override
from segscale.configs import compose_config
from segscale.data.checks.value_range import ValueRange
from segscale.data.storage.rasters import Pixels
from segscale.data.storage.sources import (
    check_max_image_pixels,
)
from segscale.errors import ConfigError
from segscale.inference.evaluation.image_metrics import read_image_metrics
from segscale.inference.evaluation.run import evaluate as evaluate_checkpoint
from segscale.inference.evaluation.run import names_data
from segscale.inference.prediction.inputs import check_pixels, range_checked, read_input_image
from segscale.inference.sliding_window import SlidingWindow
from segscale.models.checkpoint.trained import TrainedModel, load_trained
from segscale.models.module import SegmentationModule
from segscale.models.networks import check_input_side
from segscale.platforms.processes import interrupt, interruptible_child
from segscale.runs.builders import build
from segscale.runs.folder import SUMMARY_FILE, read_summary
from segscale.training.run.config_checks import prepare
from segscale.training.run_folder.resume import register_run_dir_resolver

ImageInput = Union[np.ndarray, str, "os.PathLike[str]"]
"""An image: an ``H×W×C`` (or ``H×W``) array of raw pixel values, or an image file."""

INTERRUPT_GRACE_S = 60.0
"""How long an interrupted ``train`` waits for its run to stop before killing it."""


class Predictor:
    """A trained network that labels images of any size with the sliding window.

    Made by ``load``. ``class_names``, ``colours`` (K×3 uint8, RGB per class),
    ``num_classes``, ``in_channels``, ``max_value`` and ``value_range`` are the
    checkpoint's, read from ``trained`` (its ``record``); ``module`` is the network (eval
    mode, on ``device``) and ``window`` the ``SlidingWindow`` that tiles each image.
    """

    def __init__(
        self,
        trained: TrainedModel,
        window: SlidingWindow,
        device: torch.device,
        max_image_pixels: int | None,
        ckpt: str | os.PathLike[str] = "ckpt",
    ) -> None:
        trained.module.to(device).eval()
        self.trained = trained
        self.window = window
        self.device = device
        self.max_image_pixels = max_image_pixels
        # What the images must suit, for the messages that refuse one.
        self.network = f"the network of ckpt={str(ckpt)!r}"

    @property
    def module(self) -> SegmentationModule:
        """The network, in eval mode on ``device``."""
        return self.trained.module

    @property
    def class_names(self) -> tuple[str, ...]:
        """The classes' names, in the order of the network's outputs."""
        return self.trained.class_names

    @property
    def colours(self) -> np.ndarray:
        """RGB per class (K×3 uint8)."""
        return self.trained.colours

    @property
    def num_classes(self) -> int:
        """Number of classes the network predicts."""
        return self.trained.num_classes

    @property
    def in_channels(self) -> int:
        """The channels an image must have."""
        return self.trained.in_channels

    @property
    def max_value(self) -> float:
        """The pixels' full intensity in the training images (255 for 8-bit)."""
        return self.trained.max_value

    @property
    def value_range(self) -> ValueRange | None:
        """The training images' values, which an image must not be far outside.

        ``None``: not recorded, or ``check_value_range=false``.
        """
        return self.trained.value_range

    def __repr__(self) -> str:
        return (
            f"Predictor(classes={list(self.class_names)}, in_channels={self.in_channels}, "
            f"device={self.device}, tile_size={self.window.tile_size}, "
            f"overlap={self.window.overlap})"
        )

    def predict(self, image: ImageInput) -> np.ndarray:
        """The ``H×W`` class-index map of ``image`` (uint8; uint16 past 255 classes).

        ``image``: an ``H×W×C`` array (``H×W`` for one channel) in raw pixel values, as
        the image files hold them, or the path of an image file, read as ``predict.py``
        reads its inputs. Either must suit the checkpoint as ``predict.py``'s inputs do:
        its channel count and pixel type (``uint8`` for a network trained on 8-bit
        images), float pixels finite; otherwise ``ValueError`` (``ConfigError`` for a
        file) says what the checkpoint takes.
        """
        pixels = self._pixels(image)
        labels = self.window.predict(self.module, pixels, self.num_classes, self.device)
        return cast(np.ndarray, labels)  # not None: no on_band was given

    def predict_proba(self, image: ImageInput) -> np.ndarray:
        """Class probabilities of ``image``: float32 ``K×H×W``, summing to 1 per pixel.

        The blended softmax that ``predict`` takes the argmax of; the whole map is held
        in memory (K × H × W floats), which ``predict`` avoids.
        """
        pixels = self._pixels(image)
        height, width = pixels.shape[:2]
        probabilities = np.empty((self.num_classes, height, width), dtype=np.float32)
        bands = self.window.probability_bands(self.module, pixels, self.num_classes, self.device)
        for y0, band in bands:
            probabilities[:, y0 : y0 + band.shape[1]] = band
        return probabilities

    def _pixels(self, image: ImageInput) -> Pixels:
        """``image`` as pixels whose channels the network takes (a TIFF read by window)."""
        if isinstance(image, np.ndarray):
            return self._checked_array(image)
        if isinstance(image, (str, os.PathLike)):
            return read_input_image(
                Path(image),
                self.in_channels,
                self.max_image_pixels,
                self.max_value,
                self.network,
                self.value_range,
            )
        raise TypeError(
            f"image must be a numpy array or the path of an image file, got {type(image).__name__}"
        )

    def _checked_array(self, image: np.ndarray) -> np.ndarray:
        """``image`` if its channels, pixel type and values suit the checkpoint's network."""
        channels = 1 if image.ndim == 2 else image.shape[-1]
        if image.ndim not in (2, 3) or channels != self.in_channels:
            raise ValueError(
                f"image of shape {image.shape}: {self.network} takes {self.in_channels} "
                f"channel(s); expected an H×W×{self.in_channels} array"
                + (" (or H×W)" if self.in_channels == 1 else "")
                + " of raw pixel values"
            )
        # A ConfigError is a ValueError: the array's own checks and a file's are one.
        what = f"image of dtype {image.dtype}"
        check_pixels(what, image, self.max_value, self.network, self.value_range)
        return image


def load(
    ckpt: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    *,
    tile_size: int | None = None,
    overlap: float | None = None,
    batch_size: int | None = None,
    tta: str | None = None,
    tta_scales: Sequence[float] | None = None,
    overrides: Sequence[str] = (),
) -> Predictor:
    """The network of a ``train.py`` checkpoint, ready to ``predict`` images.

    Its classes, their colours and the input normalization are the checkpoint's, as in
    ``predict.py``: there is nothing to repeat from the training config.
    The sliding window is the ``inference`` group of the shipped ``predict`` config,
    the defaults ``predict.py`` uses. ``tile_size``, ``overlap``, ``batch_size``, ``tta``
    (``"none"``, ``"hflip"``, ``"flip"``, ``"d4"``) and ``tta_scales`` (e.g.
    ``[0.75, 1, 1.25]``) replace its values; ``overrides`` are overrides of that config
    as ``predict.py`` takes them (``inference.tta=d4``, ``max_image_pixels=null``).
    A missing or damaged checkpoint, or a bad value, raises ``ConfigError`` naming it.
    """
    cfg = _compose("predict", overrides)
    window_values = {
        "tile_size": tile_size,
        "overlap": overlap,
        "batch_size": batch_size,
        "tta": tta,
        "tta_scales": list(tta_scales) if isinstance(tta_scales, (list, tuple)) else tta_scales,
    }
    for key, value in window_values.items():
        if value is not None:
            cfg.inference[key] = value
    check_max_image_pixels(cfg.max_image_pixels, "max_image_pixels")
    trained = range_checked(load_trained(Path(ckpt), key="ckpt"), cfg.check_value_range)
    check_input_side(cfg.inference.tile_size, "inference.tile_size", trained.module.network)
    window = build(cfg.inference)  # a ConfigError comes out as itself, not Hydra's wrapper
    return Predictor(trained, window, torch.device(device), cfg.max_image_pixels, ckpt)


def evaluate(
    ckpt: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    output_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Evaluate a checkpoint as ``evaluate.py ckpt=... <overrides>`` does; return its metrics.

    The metrics are ``metrics.json``'s (MATLAB's data-set and per-class metrics, with
    ``MeanBFScore`` where ``bf_tolerance`` is set), with ``images``: each image's row of
    ``image_metrics.csv`` as a dict, and ``output_dir``: the evaluation folder
    (``output_dir``, or the config's ``hydra.run.dir``). A bad override or input
    raises ``ConfigError``.
    """
    cfg = _compose("evaluate", [*overrides, f"ckpt={quoted_override(str(ckpt))}"], True)
    if output_dir is None:
        output_dir = _run_folders(cfg)[0]
    cfg.output_dir = str(Path(output_dir).absolute())
    metrics = evaluate_checkpoint(cfg, data_given=names_data(list(overrides)))
    folder = Path(cfg.output_dir)
    return {**metrics, "images": read_image_metrics(folder), "output_dir": str(folder)}


class TrainingFailedError(RuntimeError):
    """A training run that ended without success; names its exit status and run folder."""

    def __init__(self, message: str, returncode: int, run_dir: Path) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.run_dir = run_dir


def train(
    overrides: Sequence[str] = (),
    config_name: str = "train",
    config_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Train as ``segscale-train`` does with ``overrides``; return the run's summary.

    The summary is the run folder's ``summary.json`` (metrics, checkpoints, effective
    values), with ``run_dir``: the folder itself. ``config_dir`` adds a folder of the
    user's own configs (``experiment/mine.yaml`` for ``experiment=mine``), as the
    override ``hydra.searchpath=[file://<folder>]`` does. The config is composed and
    checked here first: a bad override raises ``ConfigError`` before anything starts.
    A run that fails raises ``TrainingFailedError`` (its log went to this process's output
    and to the run folder). One job only: sweeps (``-m``) are the command's.
    """
    overrides = [*overrides, *_search_path(config_dir, overrides)]
    options = [o for o in overrides if o.startswith("-")]
    if options:
        raise ConfigError(
            f"{options} are command-line options; train() takes overrides (key=value) only: "
            "use its config_name and config_dir arguments, or segscale-train for sweeps (-m)"
        )
    register_run_dir_resolver()  # hydra.run.dir of conf/train.yaml asks it
    cfg = _compose(config_name, overrides, return_hydra_config=True)
    prepare(cfg)  # datamodule/classes=auto: checked as the run will find them
    run_dir, folder = _run_folders(cfg)
    command = [
        *_train_program(),
        "--config-name",
        config_name,
        *(o for o in overrides if _key(o) != "hydra.run.dir"),
        # Resolved here, so that the child writes where this process reads.
        f"hydra.run.dir={quoted_override(str(run_dir))}",
    ]
    status = _run(command)
    if status != 0:
        ending = f"signal {-status}" if status < 0 else f"exit status {status}"
        raise TrainingFailedError(
            f"training ended with {ending} (its log is above and in {folder})", status, folder
        )
    summary = read_summary(folder)
    if summary is None:
        raise TrainingFailedError(f"training ended but wrote no {folder / SUMMARY_FILE}", 0, folder)
    return {**summary, "run_dir": str(folder)}


def _compose(
    config_name: str, overrides: Sequence[str], return_hydra_config: bool = False
) -> DictConfig:
    """``compose_config``, with Hydra's refusals of an override as ``ConfigError``."""
    try:
        return compose_config(config_name, overrides, return_hydra_config=return_hydra_config)
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError(f"config {config_name!r}: {error}") from error


def _search_path(config_dir: str | os.PathLike[str] | None, overrides: Sequence[str]) -> list[str]:
    """The override that adds ``config_dir`` to the config search path (none without one)."""
    if config_dir is None:
        return []
    if any(_key(o) == "hydra.searchpath" for o in overrides):
        raise ConfigError(
            "config_dir and a hydra.searchpath override both set the config search path; "
            "expected one of them (list every folder in hydra.searchpath=[...])"
        )
    folder = Path(config_dir).absolute()
    if not folder.is_dir():
        raise ConfigError(f"config_dir={str(config_dir)!r}: no such folder")
    return [f"hydra.searchpath=[{quoted_override(f'file://{folder}')}]"]


def _run_folders(cfg: DictConfig) -> tuple[Path, Path]:
    """``hydra.run.dir`` and the run folder (``output_dir``), absolute, as the child has them.

    ``output_dir`` is normally ``${hydra:runtime.output_dir}``, which only a running
    Hydra job can resolve: it is resolved here as Hydra would set it.
    """
    try:
        run_dir = Path(cfg.hydra.run.dir).absolute()
        cfg.hydra.runtime.output_dir = str(run_dir)
        with _hydra_config(cfg):
            folder = Path(cfg.output_dir).absolute()
    except OmegaConfBaseException as error:
        raise ConfigError(f"the run folder cannot be resolved: {error}") from error
    return run_dir, folder


@contextmanager
def _hydra_config(cfg: DictConfig) -> Iterator[None]:
    """``cfg`` as Hydra's current config (``${hydra:...}``), restoring the one before.

    Hydra keeps it in a process-wide singleton; the caller's own Hydra state, if any,
    must survive a call of ``train``.
    """
    instance = HydraConfig.instance()
    previous = instance.cfg
    instance.set_config(cfg)
    try:
        yield
    finally:
        instance.cfg = previous


def _train_program() -> list[str]:
    """The command that runs ``train.py`` (a test replaces it with a fake)."""
    return list(TRAIN_COMMAND)


def _run(command: list[str]) -> int:
    """Run ``command`` with this process's stdout and stderr; return its exit status.

    An interrupt (Ctrl-C, a notebook's stop button) reaches only this process in a
    notebook: it is passed on to the run, which then stops its ranks itself (as
    ``SIGINT``; on Windows as Ctrl-Break, a preemption signal there: the run saves
    ``last.ckpt`` of its last step).
    """
    with subprocess.Popen(command, **interruptible_child()) as process:
        try:
            return process.wait()
        except KeyboardInterrupt:
            interrupt(process)
            try:
                process.wait(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
            raise


def _key(override: str) -> str:
    """The config key of an override (``+a.b=1`` → ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")
