"""The evaluation run of ``evaluate.py``: a checkpoint on a split of a dataset.

Full-image sliding-window inference on every labelled image of a split (by default as
training validated: the checkpoint's patch grid, ``conf/inference/validation.yaml``),
accumulated into one confusion matrix: MATLAB's ``evaluateSemanticSegmentation``
(global and mean accuracy, mean and weighted IoU, per-class IoU and Dice) as JSON, CSV
and PNG, with the inference settings that made them; with ``bf_tolerance`` set, the
boundary F1 score per class too, and each image's metrics (``image_metrics.csv``).

The classes, label IDs and normalization are the checkpoint's; a classes file or key
given that differs from them is refused (``segscale.models.checkpoint.recorded_classes``).
So are the data, unless the command line names others (``datamodule=...``,
``datamodule.source...``): those must be the checkpoint's, or ``other_data=true``
(``segscale.models.checkpoint.recorded_data``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from lightning.fabric import Fabric
from omegaconf import DictConfig, OmegaConf

from segscale.config_schema import check_schema
from segscale.config_types import check_types
from segscale.configs import CONFIG_DIR
from segscale.data.checks.validation import validate_dataset
from segscale.data.classes.labels import LabelMap
from segscale.data.storage.grids import Grid, WarpedLabels
from segscale.data.storage.pixel_types import pixel_type_mismatch
from segscale.data.storage.sources import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageMaskPair,
    read_image,
    read_mask,
)
from segscale.errors import ConfigError
from segscale.inference.devices import inference_backend, run_on_devices
from segscale.inference.evaluation.image_metrics import (
    ImageScores,
    class_boundary_f1,
    data_set_boundary_f1,
    image_names,
    write_image_metrics,
)
from segscale.inference.image_progress import ImageProgress
from segscale.inference.prediction.inputs import check_pixels, range_checked
from segscale.inference.sliding_window import OnTiles, SlidingWindow
from segscale.models.boundary_f1 import boundary_f1
from segscale.models.checkpoint.recorded_classes import CLASS_KEYS, use_checkpoint_classes
from segscale.models.checkpoint.recorded_data import use_checkpoint_data
from segscale.models.checkpoint.trained import TrainedModel, load_trained
from segscale.models.metrics import evaluation_report
from segscale.models.networks import check_input_side
from segscale.runs.builders import build, check_data_source
from segscale.runs.evaluation import write_evaluation

log = logging.getLogger(__name__)

RECORDED_TILE_SIZE = "segscale.validation_inference.tile_size"
"""Where a checkpoint records its validation patch side (``inference.tile_size: checkpoint``)."""


def evaluate(cfg: DictConfig, data_given: bool = True) -> dict:
    """Evaluate ``ckpt`` on the ``split`` of the datamodule; return the metrics.

    The datamodule's class keys are filled in from the checkpoint first (``cfg`` is
    changed in place); one given otherwise raises ``ConfigError``. ``data_given``: the
    caller named the data (``datamodule.source``); if not, those the checkpoint was
    trained on replace the composed ones (``use_checkpoint_data``).
    """
    # The class keys (and the validation tile size) hold "checkpoint" until the
    # checkpoint's values replace them.
    filled_in = [f"datamodule.{key}" for key in CLASS_KEYS]
    if cfg.inference.get("tile_size") == "checkpoint":
        filled_in.append("inference.tile_size")
    check_schema(cfg)
    check_types(cfg, filled_in=filled_in)
    backend = inference_backend(cfg)
    trained = range_checked(load_trained(cfg.ckpt), cfg.check_value_range)
    check_tile_side(
        cfg.inference, trained, use_validation_tiles(cfg.inference, trained, str(cfg.ckpt))
    )
    use_checkpoint_classes(cfg.datamodule, trained, str(cfg.ckpt))
    other_data = cfg.other_data
    if data_given:
        check_data_source(cfg)  # datamodule=folder without its root, named as train.py does
    use_checkpoint_data(cfg.datamodule, trained, str(cfg.ckpt), data_given, other_data)
    datamodule = build(cfg.datamodule)
    if not datamodule.source.has_split(cfg.split):
        raise ConfigError(
            f"split={cfg.split!r}: the dataset (datamodule.source: "
            f"{type(datamodule.source).__name__}) has no such split; expected train, val, "
            "or test where the dataset has one (the embedded synthetic one has train and "
            "val; a folder dataset's are datamodule.source.splits)"
        )
    datamodule.source.prepare()
    network = f"the network of ckpt={str(cfg.ckpt)!r}"  # what the images must suit
    # Whole images are evaluated, so any size will do (patch_size 1).
    report = validate_dataset(
        datamodule.source,
        datamodule.labels,
        datamodule.class_names,
        1,
        trained.in_channels,
        splits=(cfg.split,),
        max_image_pixels=datamodule.max_image_pixels,
        channels_from=network,
        checkpoint=str(cfg.ckpt),
        mask_alignment=datamodule.mask_alignment,
        nodata=datamodule.sampling.nodata,
    )
    pairs = report.pairs[cfg.split]
    # Every image has the report's pixel type (validation refuses a mix): one check.
    mismatch = pixel_type_mismatch(report.dtype, trained.max_value, network)
    if mismatch and pairs:
        raise ConfigError(f"split={cfg.split}: {pairs[0].image}: {mismatch}")
    window = build(cfg.inference)
    tolerance = bf_tolerance(cfg.bf_tolerance)
    log.info("evaluating %s on %d %s image(s)", cfg.ckpt, len(pairs), cfg.split)
    images: list[ImageScores] = run_on_devices(
        cfg.accelerator,
        cfg.devices,
        backend,
        _scores_of_share,
        list(enumerate(pairs)),
        trained,
        window,
        datamodule.labels,
        datamodule.max_image_pixels,
        tolerance,
        report.warped_masks,
    )
    confusion = torch.from_numpy(
        sum((image.confusion for image in images), np.zeros((trained.num_classes,) * 2, np.int64))
    )
    output = Path(cfg.output_dir)
    inference = inference_record(window)
    class_bf, mean_bf = class_boundary_f1(images), data_set_boundary_f1(images)
    write_evaluation(
        output,
        confusion,
        trained.class_names,
        f"Confusion matrix, split={cfg.split}",
        inference=inference,
        boundary_f1=class_bf,
        mean_boundary_f1=mean_bf,
        bf_tolerance=tolerance,
    )
    names = image_names([pair.image for pair in pairs])
    write_image_metrics(output, images, names, trained.class_names)
    metrics = evaluation_report(confusion, trained.class_names, class_bf, mean_bf, tolerance)
    metrics |= {"inference": inference}
    log.info("%s", json.dumps({k: v for k, v in metrics.items() if k != "classes"}))
    log.info("per class:\n%s", class_table(metrics["classes"]))
    log.info("evaluation written to %s", output)
    return metrics


def names_data(overrides: list[str]) -> bool:
    """Whether command-line ``overrides`` choose the data: ``datamodule=...`` or its source.

    Other ``datamodule`` keys (``max_image_pixels``, the classes) leave the data to the
    checkpoint.
    """
    keys = [o.key_or_group for o in OverridesParser.create().parse_overrides(list(overrides))]
    return any(key == "datamodule" or key.startswith("datamodule.source") for key in keys)


def use_validation_tiles(inference: DictConfig, trained: TrainedModel, ckpt: str) -> str:
    """Fill ``inference.tile_size: checkpoint`` (in place) with the validation grid's side.

    A checkpoint written before segscale recorded it (``validation_inference``) gets
    predict.py's tile size (``conf/inference/default.yaml``), and the log says so.
    Returns what gave the tile size, for a refusal of it: ``inference.tile_size``, or
    the checkpoint's field (the user never gave a size then).
    """
    if inference.get("tile_size") != "checkpoint":
        return "inference.tile_size"
    recorded = trained.validation_inference
    if recorded is None:
        default = OmegaConf.load(Path(CONFIG_DIR) / "inference" / "default.yaml")
        log.warning(
            "ckpt=%r does not record the patch size it was validated with (it was written "
            "by an earlier segscale): evaluating with inference.tile_size=%d",
            ckpt,
            default.tile_size,
        )
        inference.tile_size = default.tile_size
        return "inference.tile_size"
    inference.tile_size = int(recorded["tile_size"])
    return f"ckpt={ckpt!r}: its {RECORDED_TILE_SIZE}"


def check_tile_side(inference: DictConfig, trained: TrainedModel, given_by: str) -> None:
    """Refuse a tile side the network cannot take, naming what gave it (``given_by``).

    A side the checkpoint recorded is refused as the checkpoint's (train.py records the
    patch side it trained with, which the network takes), with how to evaluate anyway.
    """
    try:
        check_input_side(inference.tile_size, given_by, trained.module.network)
    except ConfigError as error:
        if given_by == "inference.tile_size":
            raise
        raise ConfigError(
            f"{error}; train.py records the patch side the run trained with, which its "
            "network takes, so the checkpoint was edited or is another tool's: give "
            "inference.tile_size=<side> to evaluate with tiles of your choice"
        ) from None


def inference_record(window: SlidingWindow) -> dict[str, object]:
    """The inference settings a number was measured with, for ``metrics.json`` and the log."""
    return {
        "tile_size": window.tile_size,
        "overlap": window.overlap,
        "blend": window.blend,
        "tta": window.tta,
        "tta_scales": list(window.tta_scales),
    }


def bf_tolerance(value: object) -> float | None:
    """``bf_tolerance`` checked: a fraction of the image diagonal in (0, 1), or None (off)."""
    if value is None or (type(value) in (int, float) and value == 0):
        return None
    if type(value) not in (int, float) or not 0 < value < 1:  # type: ignore[operator]
        raise ConfigError(
            f"bf_tolerance={value!r} is not allowed: expected a fraction of the image "
            "diagonal between 0 and 1 (MATLAB's 0.0075), or null or 0 for no BF score"
        )
    return float(value)  # type: ignore[arg-type]


def class_table(classes: dict[str, dict[str, float | None]]) -> str:
    """Per-class accuracy, IoU, Dice (and BF score) as aligned text lines (``-``: absent)."""
    width = max([5, *(len(name) for name in classes)])
    keys = ["Accuracy", "IoU", "Dice"]
    if any("MeanBFScore" in values for values in classes.values()):
        keys.append("MeanBFScore")
    sides = [max(8, len(key)) for key in keys]
    row = [f"{key:>{side}}" for key, side in zip(keys, sides, strict=True)]
    lines = [f"{'class':<{width}}  " + "  ".join(row)]
    for name, values in classes.items():
        cells = ["-" if values.get(key) is None else f"{values[key]:.4f}" for key in keys]
        row = [f"{cell:>{side}}" for cell, side in zip(cells, sides, strict=True)]
        lines.append(f"{name:<{width}}  " + "  ".join(row))
    return "\n".join(lines)


def _scores_of_share(
    fabric: Fabric,
    pairs: list[tuple[int, ImageMaskPair]],
    trained: TrainedModel,
    window: SlidingWindow,
    labels: LabelMap,
    max_image_pixels: int | None,
    tolerance: float | None,
    warped_masks: dict[Path, Grid],
) -> list[ImageScores]:
    trained.module.to(fabric.device)
    # Each rank counts its own share; rank 0's lines speak for all (shares are equal).
    what = "images evaluated" + (" by process 0" if fabric.world_size > 1 else "")
    progress = ImageProgress(len(pairs), what, log if fabric.global_rank == 0 else None)
    images = []
    for index, pair in pairs:
        grid = warped_masks.get(pair.mask)
        on_tiles = progress.image(pair.image.name)
        confusion, bf = image_scores(
            pair,
            trained,
            window,
            labels,
            fabric.device,
            max_image_pixels,
            tolerance,
            grid,
            on_tiles,
        )
        images.append(ImageScores(index, confusion.numpy(), bf))
        progress.image_done()
    progress.close()
    if fabric.world_size == 1:
        return images
    # Every rank's images, each with its own counts and BF scores: the data set's BF
    # score averages over images, so per-image values cross, not sums. numpy arrays
    # cross back from a spawned rank by value (a tensor would be shared memory).
    everyone: list[list[ImageScores] | None] = [None] * fabric.world_size
    torch.distributed.all_gather_object(everyone, images)
    return [image for share in everyone if share for image in share]


def image_scores(
    pair: ImageMaskPair,
    trained: TrainedModel,
    window: SlidingWindow,
    labels: LabelMap,
    device: torch.device,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    tolerance: float | None = None,
    mask_grid: Grid | None = None,
    on_tiles: OnTiles | None = None,
) -> tuple[torch.Tensor, np.ndarray | None]:
    """One image's confusion matrix and, with a ``tolerance``, its BF score per class.

    ``on_tiles``: told of each batch of tiles done (progress).

    The BF score needs the whole label maps (a boundary's match may lie in another
    band): with a tolerance, the predicted and true class of every pixel are kept
    (2 bytes each); without, the image is counted band by band and nothing is kept.
    """
    maps: list[np.ndarray] = []
    confusion = image_confusion(
        pair,
        trained,
        window,
        labels,
        device,
        max_image_pixels,
        maps if tolerance else None,
        mask_grid,
        on_tiles,
    )
    if not tolerance:
        return confusion, None
    return confusion, boundary_f1(maps[0], maps[1], trained.num_classes, tolerance)


def image_confusion(
    pair: ImageMaskPair,
    trained: TrainedModel,
    window: SlidingWindow,
    labels: LabelMap,
    device: torch.device,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    maps: list[np.ndarray] | None = None,
    mask_grid: Grid | None = None,
    on_tiles: OnTiles | None = None,
) -> torch.Tensor:
    """Confusion matrix (true × predicted pixels) of one whole image, band by band.

    ``max_image_pixels``: the size limit of the readers (``datamodule.max_image_pixels``).
    ``maps``: a list that receives the true and the predicted class maps (the ignore
    index and unknown values as ``num_classes``), where the caller needs them whole.
    ``mask_grid``: the mask read on this grid, its image's (``datamodule.mask_alignment=
    warp``, ``segscale.data.storage.grids``). ``on_tiles``: told of each batch of tiles.
    """
    if mask_grid is None:
        mask = read_mask(pair.mask, max_image_pixels)
        raw: Any = mask.values
        table = labels.palette_table(mask.palette)  # a palette mask as trained
    else:  # its class indices, a palette mask's read as trained
        raw, table = WarpedLabels(pair.mask, mask_grid, labels), None
    classes = trained.num_classes
    counts = np.zeros(classes * classes, np.int64)
    if maps is not None:
        maps += [np.empty(raw.shape[:2], np.uint16), np.empty(raw.shape[:2], np.uint16)]

    def count(y0: int, predicted: np.ndarray) -> None:
        rows = np.asarray(raw[y0 : y0 + len(predicted)])
        truth = rows if mask_grid is not None else labels.decode(rows, table)  # warped: classes
        labelled = truth < classes  # the ignore index (and unknown values) are not counted
        if maps is not None:
            maps[0][y0 : y0 + len(predicted)] = np.where(labelled, truth, classes)
            maps[1][y0 : y0 + len(predicted)] = predicted
        truth, labelled = truth.ravel(), labelled.ravel()
        pairs = truth[labelled].astype(np.int64) * classes + predicted.ravel()[labelled]
        counts[:] += np.bincount(pairs, minlength=classes * classes)

    image = read_image(pair.image, max_image_pixels)
    network = "the network of ckpt"
    check_pixels(pair.image, image, trained.max_value, network, trained.value_range)
    window.predict(trained.module, image, classes, device, on_band=count, on_tiles=on_tiles)
    return torch.from_numpy(counts.reshape(classes, classes))
