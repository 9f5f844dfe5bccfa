"""The docs' onnxruntime example (docs/prediction.md) gives predict.py's mask.

The code is taken from the page as written (the Python block after "With onnxruntime
only") and run in a folder holding ``best.onnx`` and ``tile.png``, an image whose sides
are not multiples of the network's output stride.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from segscale.cli.predict import main as predict_main
from segscale.inference.export.formats import ExportSettings
from segscale.inference.export.run import export_network
from segscale.models.checkpoint.trained import load_trained
from tests.helpers.in_process import run_in_process
from tests.inference.export.test_run import _deeplab_checkpoint

PAGE = Path(__file__).resolve().parents[3] / "docs" / "prediction.md"


def onnx_example() -> str:
    """The page's Python block that follows "With onnxruntime only"."""
    text = PAGE.read_text()
    start = text.index("With onnxruntime only")
    found = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert found, "docs/prediction.md's onnxruntime example is gone"
    return found.group(1)


@pytest.mark.slow
def test_the_docs_onnx_example_gives_predict_s_mask(tmp_path: Path, monkeypatch):
    ckpt = _deeplab_checkpoint(tmp_path / "best.ckpt")  # global pooling: padding matters
    export_network(load_trained(ckpt), tmp_path / "best.onnx", ExportSettings("onnx"), verify=False)
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (150, 203, 3), dtype=np.uint8)  # 16 divides neither side
    image[40:110, 60:160] //= 3  # some structure for the classes to follow
    Image.fromarray(image).save(tmp_path / "tile.png")
    out = tmp_path / "predicted"
    done = run_in_process(
        predict_main,
        f"ckpt={ckpt}",
        f"input={tmp_path / 'tile.png'}",
        "accelerator=cpu",
        "overlay=false",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
        program="predict.py",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    predicted = np.asarray(Image.open(out / "tile.png"))

    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(onnx_example(), "docs/prediction.md", "exec"), namespace)
    mask = namespace["mask"]
    assert mask.shape == predicted.shape
    assert len(np.unique(predicted)) > 1  # a mask of one class would agree by chance
    assert (mask == predicted).mean() >= 0.999
