"""``python export.py ckpt=... [format=onnx|torchscript]``: a trained network as one file.

The file (``segscale.inference.export.run``) takes raw pixel values, normalises them inside
and returns class scores or the mask, for onnxruntime, TorchScript or any ONNX runtime,
with no segscale or training config needed. It is checked against PyTorch before it
is moved into place.

Exit statuses: 0, the file was written; 2 (``EXIT_BAD_INPUT``), refused: a config
value, or a checkpoint that is missing or damaged; 1, the exported file did not compute
what PyTorch computes (``ExportMismatchError``), and nothing was written.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from segscale.config_schema import check_schema
from segscale.configs import CONFIG_DIR
from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.inference.export.check import ExportMismatchError
from segscale.inference.export.formats import FORMATS, ExportSettings, check_settings, resolve_dtype
from segscale.inference.export.run import ExportedNetwork, export_network
from segscale.models.checkpoint.trained import load_trained

log = logging.getLogger(__name__)

EXIT_MISMATCH = 1
"""Exit status of an export whose file did not match PyTorch (nothing written)."""


def export(cfg: DictConfig) -> ExportedNetwork:
    """Write the network of ``ckpt`` as ``format`` to ``output``; return what was written."""
    check_schema(cfg)
    check_settings(cfg.format, cfg.dtype, cfg.returns, cfg.opset)
    if cfg.format != "onnx" and cfg.opset is not None:
        log.warning("opset=%s is ignored: it applies to format=onnx only", cfg.opset)
    path = output_path(cfg)
    trained = load_trained(cfg.ckpt)
    dtype = resolve_dtype(cfg.dtype, trained.max_value)
    settings = ExportSettings(cfg.format, dtype, cfg.returns, cfg.opset)
    log.info(
        "exporting %s as %s (%s in, %s out) → %s", cfg.ckpt, cfg.format, dtype, cfg.returns, path
    )
    exported = export_network(trained, path, settings, verify=cfg.verify)
    checked = (
        f"; matches PyTorch within {exported.max_difference:.2g}"
        if exported.max_difference is not None
        else ""
    )
    log.info("%s (%.1f MB)%s", exported.path, exported.size_bytes / 1e6, checked)
    return exported


def output_path(cfg: DictConfig) -> Path:
    """``output``, or ``<output_dir>/<ckpt name>.onnx`` (``.pt``) when it is null."""
    if cfg.output is None:
        return Path(cfg.output_dir) / f"{Path(str(cfg.ckpt)).stem}{FORMATS[cfg.format]}"
    path = Path(str(cfg.output))
    if path.is_dir():
        raise ConfigError(f"output={str(path)!r} is a folder: expected the path of a file")
    return path


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="export")
def main(cfg: DictConfig) -> None:
    """Entry point of ``export.py``: exit 0, ``EXIT_BAD_INPUT`` or ``EXIT_MISMATCH``."""
    try:
        export(cfg)
    except ConfigError as error:
        log.error("%s", error)
        sys.exit(EXIT_BAD_INPUT)
    except ExportMismatchError as error:
        log.error("nothing written: %s", error)
        sys.exit(EXIT_MISMATCH)


if __name__ == "__main__":
    main()
