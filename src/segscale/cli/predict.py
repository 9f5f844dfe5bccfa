"""``python predict.py ckpt=... input=...``: label maps of images of any size.

Every image goes through ``SlidingWindow`` (the ``inference`` config group); its label
map is written as a palette PNG or TIFF (class indices that open in colour in any
viewer), with an overlay of the classes on the image beside it.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.utils import instantiate
from lightning.fabric import Fabric
from omegaconf import DictConfig

from segscale.checks import ConfigError
from segscale.cli.train import CONFIG_DIR
from segscale.data.sources import IMAGE_SUFFIXES, read_image
from segscale.inference.devices import run_on_devices
from segscale.inference.outputs import BandImage, overlay
from segscale.inference.sliding_window import SlidingWindow
from segscale.inference.trained import TrainedModel, load_trained

log = logging.getLogger(__name__)


def predict(cfg: DictConfig) -> list[Path]:
    """Predict every image that ``input`` names; return the mask files written.

    With several devices, the returned list is that of rank 0's share (every rank
    writes its own images into the same folder).
    """
    trained = load_trained(cfg.ckpt)
    images = input_images(cfg.input)
    window = instantiate(cfg.inference)
    output = Path(cfg.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    log.info("%d image(s) → %s", len(images), output)
    return run_on_devices(
        cfg.accelerator, cfg.devices, _predict_share, images, trained, window, output, cfg
    )


def input_images(value: str) -> list[Path]:
    """The images that ``input`` names: an image, a folder of images, or a .txt list.

    A list names one image path per line (relative to the list's folder or absolute);
    blank lines and ``#`` comments are skipped. Outputs are named by file stem, so two
    inputs with the same stem are refused.
    """
    path = Path(value)
    if path.is_dir():
        images = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    elif path.suffix.lower() == ".txt" and path.is_file():
        lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
        images = [path.parent / line for line in lines if line]
    elif path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
        images = [path]
    else:
        raise ConfigError(
            f"input={value!r} is not an image, a folder or a .txt list; expected one of "
            f"those (images: {', '.join(IMAGE_SUFFIXES)})"
        )
    missing = [str(p) for p in images if not p.is_file()]
    if missing or not images:
        raise ConfigError(f"input={value!r}: " + (f"missing {missing}" if missing else "no images"))
    stems: dict[str, Path] = {}
    for image in images:
        if image.stem in stems:
            raise ConfigError(f"input={value!r}: {image} and {stems[image.stem]} share a name")
        stems[image.stem] = image
    return images


def _predict_share(
    fabric: Fabric,
    images: list[Path],
    trained: TrainedModel,
    window: SlidingWindow,
    output: Path,
    cfg: DictConfig,
) -> list[Path]:
    trained.module.to(fabric.device)
    written = [predict_image(path, trained, window, output, cfg, fabric.device) for path in images]
    fabric.barrier()
    return written


def predict_image(
    path: Path,
    trained: TrainedModel,
    window: SlidingWindow,
    output: Path,
    cfg: DictConfig,
    device: torch.device,
) -> Path:
    """Write ``<stem>.<format>`` (and ``<stem>_overlay.<format>``) for one image."""
    image = read_image(path)
    if image.shape[2] != trained.in_channels:
        raise ConfigError(
            f"{path}: has {image.shape[2]} channels, the network of ckpt takes "
            f"{trained.in_channels}"
        )
    height, width = image.shape[:2]
    outputs = [BandImage(output / path.stem, (height, width), cfg.format, trained.colours)]
    if cfg.overlay:
        name = output / f"{path.stem}_overlay"
        outputs.append(BandImage(name, (height, width, 3), cfg.format, None))

    def write(y0: int, labels: np.ndarray) -> None:
        outputs[0].write(y0, labels)
        if cfg.overlay:
            rows = image[y0 : y0 + len(labels)]
            blended = overlay(rows, labels, trained.colours, cfg.overlay_alpha, trained.max_value)
            outputs[1].write(y0, blended)

    try:
        window.predict(trained.module, image, trained.num_classes, device, on_band=write)
    except BaseException:
        for out in outputs:
            out.discard()
        raise
    mask = outputs[0].close()
    for out in outputs[1:]:
        out.close()
    log.info("%s (%dx%d) → %s", path, width, height, mask.name)
    return mask


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="predict")
def main(cfg: DictConfig) -> None:
    """Entry point of ``predict.py``."""
    try:
        predict(cfg)
    except ConfigError as error:
        log.error("%s", error)
        sys.exit(2)
