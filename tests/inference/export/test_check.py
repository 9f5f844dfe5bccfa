"""The check of an exported file against PyTorch, and the file it keeps out."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import segscale.inference.export.run as export_module
from segscale.inference.export.check import ExportMismatchError, check_exported
from segscale.inference.export.formats import ExportSettings
from segscale.inference.export.run import export_network, exportable
from segscale.models.checkpoint.trained import load_trained
from tests.conftest import oracle_checkpoint
from tests.inference.export.test_run import _export


def test_the_built_in_check_passes_and_reports_the_difference(tmp_path: Path):
    trained = load_trained(oracle_checkpoint(tmp_path / "oracle.ckpt"))
    settings = ExportSettings("onnx", "float32", "mask")
    written = export_network(trained, tmp_path / "net.onnx", settings)
    assert written.max_difference is not None and written.max_difference <= 1e-4


def test_a_file_that_differs_from_pytorch_is_refused_and_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    trained = load_trained(oracle_checkpoint(tmp_path / "oracle.ckpt"))
    path = _export(trained, tmp_path / "net.pt", "torchscript")
    other = exportable(trained, "scores")
    other.mean += 1  # a reference the file cannot match
    image = torch.full((1, 3, 8, 8), 100, dtype=torch.uint8)
    with pytest.raises(ExportMismatchError, match=r"differs from PyTorch by .* on a 1×3×8×8"):
        check_exported(path, ExportSettings("torchscript"), other, [image])

    def refuse(*args, **kwargs):
        raise ExportMismatchError("refused")

    monkeypatch.setattr(export_module, "check_exported", refuse)
    out = tmp_path / "out"
    with pytest.raises(ExportMismatchError):
        export_network(trained, out / "net.pt", ExportSettings("torchscript"))
    assert not list(out.iterdir())  # neither the file nor its temporary
