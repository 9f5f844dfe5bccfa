"""The prediction run of ``predict.py``: label maps of images of any size.

Every image goes through ``SlidingWindow`` (the ``inference`` config group); its label
map is written as a palette PNG or TIFF (class indices that open in colour in any
viewer), with an overlay of the classes on the image beside it, and when asked the
class probabilities, confidence and entropy as GeoTIFFs (``probability_maps``), from
the same bands of probabilities that the mask is the argmax of. Before any of that,
every input's header is checked, so an unreadable file stops the run before it starts
(or, with ``skip_unreadable``, is left out).

Unreadable inputs are refused together (``UnreadableImageError``), or with
``skip_unreadable`` left out and reported in ``PredictionRun.skipped``;
``segscale.cli.predict`` maps that to its exit statuses.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.fabric import Fabric
from omegaconf import DictConfig, OmegaConf

from segscale.config_schema import check_schema
from segscale.config_types import check_types
from segscale.data.storage.pixel_types import check_image_headers
from segscale.data.storage.rasters import Pixels
from segscale.data.storage.sources import (
    FileProblem,
    check_max_image_pixels,
    describe_read_error,
)
from segscale.errors import ConfigError
from segscale.inference.devices import inference_backend, run_on_devices
from segscale.inference.image_progress import ImageProgress
from segscale.inference.prediction.inputs import (
    UnreadableImageError,
    check_output_names,
    input_images,
    output_stems,
    range_checked,
    read_input_georeference,
    read_input_image,
)
from segscale.inference.prediction.outputs import BandImage, overlay
from segscale.inference.prediction.probability_maps import ProbabilityFiles, ProbabilityOutputs
from segscale.inference.sliding_window import OnTiles, SlidingWindow
from segscale.models.checkpoint.trained import TrainedModel, load_trained
from segscale.models.networks import check_input_side
from segscale.runs.builders import build
from segscale.runs.folder import (
    LOCK_FILE,
    RECORD_DIR,
    RunFolderLock,
    launch_record,
    stop_logging_into,
    write_launch_record,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PredictionRun:
    """What a prediction run did: the masks it wrote and the inputs it skipped."""

    written: list[Path]
    """Mask files written by every rank."""
    skipped: list[FileProblem]
    """Inputs left out as unreadable (``skip_unreadable=true``), each with its reason."""


def predict(cfg: DictConfig) -> list[Path]:
    """Predict every image that ``input`` names; return the mask files written.

    ``run_prediction`` does the work and also reports the inputs skipped as unreadable.
    """
    return run_prediction(cfg).written


def run_prediction(cfg: DictConfig) -> PredictionRun:
    """Check every input's header, then predict the readable images.

    The prediction holds ``output_dir`` throughout, and takes only a fresh one
    (``prediction_folder``: one prediction per folder, nothing overwritten).
    """
    with prediction_folder(cfg):
        return _predict_in_folder(cfg)


def _predict_in_folder(cfg: DictConfig) -> PredictionRun:
    """``run_prediction`` once the output folder is this prediction's.

    Inputs whose outputs would share a name are refused (``check_output_names``). Every
    input is opened first, without decoding (``check_image_headers``: size limit
    ``max_image_pixels``, channel count, pixel type against the checkpoint's, PNG
    checksums). Problems raise one
    ``UnreadableImageError`` listing every bad file, before anything is predicted or
    written; an image that fails only while it is decoded stops the run the same way,
    naming it. With ``skip_unreadable`` such files are logged and left out instead.
    With several devices every rank writes its share into the same folder.
    """
    check_schema(cfg)
    check_max_image_pixels(cfg.max_image_pixels, "max_image_pixels")
    extras = ProbabilityOutputs(cfg.probabilities, cfg.confidence)  # refused before any work
    backend = inference_backend(cfg)
    check_types(cfg)
    trained = range_checked(load_trained(cfg.ckpt), cfg.check_value_range)
    check_input_side(cfg.inference.tile_size, "inference.tile_size", trained.module.network)
    images = input_images(cfg.input)
    check_output_names(images, cfg.overlay, extras.suffixes)
    network = f"the network of ckpt={str(cfg.ckpt)!r}"
    unreadable = check_image_headers(
        images, trained.in_channels, network, cfg.max_image_pixels, trained.max_value
    )
    _refuse_or_skip(unreadable, cfg, "nothing was predicted")
    skipped = {problem.path for problem in unreadable}
    readable = [path for path in images if path not in skipped]
    window = build(cfg.inference)
    output = Path(cfg.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    log.info("%d image(s) → %s", len(readable), output)
    written, failed = run_on_devices(
        cfg.accelerator,
        cfg.devices,
        backend,
        _predict_share,
        readable,
        trained,
        window,
        output,
        cfg,
    )
    undecodable = [FileProblem(path, reason) for path, reason in failed]
    _refuse_or_skip(undecodable, cfg, "prediction stopped there; masks written before stay")
    return PredictionRun(written, unreadable + undecodable)


def _refuse_or_skip(problems: list[FileProblem], cfg: DictConfig, outcome: str) -> None:
    """Raise ``UnreadableImageError`` listing ``problems``, or log them as skipped."""
    if not problems:
        return
    listing = "\n".join(f"  {problem.path}: {problem.reason}" for problem in problems)
    if not cfg.skip_unreadable:
        raise UnreadableImageError(
            f"{len(problems)} input image(s) of input={cfg.input!r} cannot be read; "
            f"{outcome} (skip_unreadable=true predicts the others):\n{listing}"
        )
    log.warning("skipping %d unreadable input image(s):\n%s", len(problems), listing)


def _predict_share(
    fabric: Fabric,
    images: list[Path],
    trained: TrainedModel,
    window: SlidingWindow,
    output: Path,
    cfg: DictConfig,
) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Predict the images of this rank; return every rank's masks and undecodable inputs.

    An image that cannot be decoded is skipped with ``skip_unreadable``; without, it
    ends this rank's share (one device: the run stops at it).
    """
    trained.module.to(fabric.device)
    written: list[Path] = []
    failed: list[tuple[Path, str]] = []
    # Each rank counts its own share; rank 0's bar and lines speak for all (shares are equal).
    what = "images predicted" + (" by process 0" if fabric.world_size > 1 else "")
    progress = ImageProgress(len(images), what, log if fabric.global_rank == 0 else None)
    for path in images:
        on_tiles = progress.image(path.name)
        try:
            written.append(
                predict_image(path, trained, window, output, cfg, fabric.device, on_tiles)
            )
        except UnreadableImageError as error:
            failed.append((path, describe_read_error(path, error)))
            if not cfg.skip_unreadable:
                break
        progress.image_done()
    progress.close()
    fabric.barrier()
    # Plain tuples, not FileProblem: Lightning hands rank 0's result back from a spawned
    # process through a walk that cannot rebuild frozen dataclasses.
    return _all_ranks(fabric, written), _all_ranks(fabric, failed)


def _all_ranks(fabric: Fabric, items: list[Any]) -> list[Any]:
    """The lists ``items`` of every rank, joined in rank order (on every rank)."""
    if fabric.world_size == 1:
        return items
    return [item for rank in range(fabric.world_size) for item in fabric.broadcast(items, rank)]


def predict_image(
    path: Path,
    trained: TrainedModel,
    window: SlidingWindow,
    output: Path,
    cfg: DictConfig,
    device: torch.device,
    on_tiles: OnTiles | None = None,
) -> Path:
    """Write ``<stem>.<format>`` (and ``<stem>_overlay.<format>``) for one image.

    ``on_tiles``: told of each batch of tiles done (progress).

    With ``probabilities`` or ``confidence``, also the GeoTIFFs of ``probability_maps``,
    from the same bands of blended probabilities that the mask is the argmax of. A
    GeoTIFF input's georeferencing goes with them all (``BandImage``, ``RasterFile``).

    Raises ``UnreadableImageError`` naming ``path`` if it cannot be decoded (or is past
    ``max_image_pixels``); nothing is written then.
    """
    network = f"the network of ckpt={str(cfg.ckpt)!r}"
    image = read_input_image(
        path,
        trained.in_channels,
        cfg.max_image_pixels,
        trained.max_value,
        network,
        trained.value_range,
    )
    geo = read_input_georeference(path)  # the outputs lie where the input lies
    height, width = image.shape[:2]
    extras = ProbabilityOutputs(cfg.probabilities, cfg.confidence)
    mask_stem, *overlay_stem = output_stems(path, cfg.overlay)
    size = (height, width)
    images: list[BandImage] = []
    probability_files = None
    try:
        images.append(BandImage(output / mask_stem, size, cfg.format, trained.colours, geo))
        for stem in overlay_stem:
            images.append(BandImage(output / stem, (*size, 3), cfg.format, None, geo))
        if extras.suffixes:
            names = trained.class_names
            probability_files = ProbabilityFiles(output / mask_stem, size, names, extras, geo)
        _fill(images, probability_files, image, trained, window, cfg, device, on_tiles)
    except BaseException:  # an interrupted image leaves none of its files
        for out in images:
            out.discard()
        if probability_files is not None:
            probability_files.discard()
        raise
    mask = images[0].close()
    for out in images[1:]:
        out.close()
    if probability_files is not None:
        probability_files.close()
    log.info("%s (%dx%d) → %s", path, width, height, mask.name)
    return mask


def _fill(
    images: list[BandImage],
    probability_files: ProbabilityFiles | None,
    image: Pixels,
    trained: TrainedModel,
    window: SlidingWindow,
    cfg: DictConfig,
    device: torch.device,
    on_tiles: OnTiles | None = None,
) -> None:
    """Predict ``image`` band by band into the mask (and overlay) and probability files.

    The mask is the argmax of each band of blended probabilities, as
    ``SlidingWindow.predict`` takes it; no band is kept once written.
    """
    dtype = np.uint8 if trained.num_classes <= 255 else np.uint16
    bands = window.probability_bands(trained.module, image, trained.num_classes, device, on_tiles)
    for y0, probabilities in bands:
        labels = probabilities.argmax(axis=0).astype(dtype)
        images[0].write(y0, labels)
        if cfg.overlay:
            rows = image[y0 : y0 + len(labels)]
            blended = overlay(rows, labels, trained.colours, cfg.overlay_alpha, trained.max_value)
            images[1].write(y0, blended)
        if probability_files is not None:
            probability_files.write(y0, probabilities)


KEY = "hydra.run.dir, or output_dir"
"""The settings that pick a prediction's folder (output_dir is hydra.run.dir unless set)."""
SHOWN = 5
"""Entries a refusal names, of those found in the folder."""


@contextmanager
def prediction_folder(cfg: DictConfig) -> Iterator[Path]:
    """Hold ``cfg.output_dir`` for the prediction inside, once it is known to be fresh.

    Raises ``ConfigError`` (``RunFolderBusyError``) naming the folder when another
    prediction holds it, or when it holds anything a prediction that wrote no mask
    would not have left (``unexpected_entries``).
    """
    folder = Path(cfg.output_dir)
    with RunFolderLock(folder, what="prediction", key=KEY):
        found = unexpected_entries(folder)
        if found:
            stop_logging_into(folder)  # the log there is the earlier run's
            shown = ", ".join(found[:SHOWN]) + (", ..." if len(found) > SHOWN else "")
            raise ConfigError(
                f"{folder} already holds {len(found)} file(s) or folder(s) that this "
                f"prediction would not write ({shown}): the masks of another prediction, "
                f"or files of yours; nothing was predicted, so none was overwritten. "
                f"Predict into a new folder ({KEY})"
            )
        record_folder = _hydra_run_folder()
        if record_folder is not None:  # what and where Hydra itself would have recorded
            write_launch_record(record_folder, launch_record(cfg))
        yield folder


def _hydra_run_folder() -> str | None:
    """The run folder of the Hydra run this is (``hydra.runtime.output_dir``), if it is one.

    A config composed without a run (a test, the API) leaves it unset.
    """
    if not HydraConfig.initialized():
        return None
    # Hydra annotates it HydraConf, but it holds the config masked to its "hydra" key.
    hydra_cfg = cast(DictConfig, HydraConfig.instance().cfg)
    folder = OmegaConf.select(
        hydra_cfg, "hydra.runtime.output_dir", default=None, throw_on_missing=False
    )
    return None if folder is None else str(folder)


def unexpected_entries(folder: Path) -> list[str]:
    """The entries of ``folder`` that a prediction which wrote no mask leaves none of."""
    with os.scandir(folder) as entries:
        return sorted(
            entry.name + ("/" if entry.is_dir() else "")
            for entry in entries
            if not _left_before_masks(entry)
        )


def _left_before_masks(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is of the forms a prediction writes before its first mask.

    The lock file and the launch records' folder as themselves (not links to something
    else), and Hydra's ``*.log`` files.
    """
    if entry.name == LOCK_FILE:
        return entry.is_file(follow_symlinks=False)
    if entry.name == RECORD_DIR:
        return entry.is_dir(follow_symlinks=False)
    return entry.name.endswith(".log") and entry.is_file(follow_symlinks=False)
