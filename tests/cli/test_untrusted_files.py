"""Files from others never run code: every place that loads one refuses a malicious pickle."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from segscale.cli import evaluate as evaluate_py
from segscale.cli import export as export_py
from segscale.cli import predict as predict_py
from segscale.cli import train as train_py
from segscale.errors import ConfigError
from segscale.inference.evaluation.run import evaluate
from segscale.inference.prediction.run import predict
from segscale.models.checkpoint.files import save_checkpoint_file
from segscale.runs.builders import build_datamodule, build_module
from segscale.training.run.training_run import train
from tests.conftest import REPO, compose_config, folder_dataset, oracle_checkpoint, tiny_overrides
from tests.helpers.in_process import run_in_process
from tests.models.test_weights import WritesAFile


def malicious_checkpoint(path: Path, marker: Path) -> Path:
    """A checkpoint-shaped file whose pickle would create ``marker`` when loaded."""
    torch.save({"state_dict": {}, "segscale": {}, "payload": WritesAFile(marker)}, path)
    return path


def test_train_refuses_to_resume_from_it(make_config, tmp_path):
    marker = tmp_path / "ran"
    bad = malicious_checkpoint(tmp_path / "shared.ckpt", marker)
    with pytest.raises(ConfigError, match=r"ckpt_path='.*shared\.ckpt' cannot be read"):
        train(make_config(f"ckpt_path={bad}"))
    assert not marker.exists()


def test_bench_and_train_refuse_it_as_encoder_weights(make_config, tmp_path):
    # bench.py builds its module with build_module, as train.py does.
    marker = tmp_path / "ran"
    bad = malicious_checkpoint(tmp_path / "encoder.pth", marker)
    cfg = make_config(f"model.encoder_weights={bad}")
    effective = instantiate(cfg.scaling).resolve(cfg.datamodule.batch_size, 0.01, 1)
    datamodule = build_datamodule(cfg, effective)
    with pytest.raises(ConfigError, match=r"model\.encoder_weights='.*encoder\.pth' cannot be"):
        build_module(cfg, datamodule, 0.01)
    assert not marker.exists()


def test_predict_and_evaluate_refuse_it(tmp_path):
    marker = tmp_path / "ran"
    bad = malicious_checkpoint(tmp_path / "shared.ckpt", marker)
    image = folder_dataset(tmp_path / "data", size=64) / "val" / "images" / "tile0.png"
    with pytest.raises(ConfigError, match=r"ckpt='.*shared\.ckpt' cannot be read"):
        predict(
            compose_config(
                "predict", f"ckpt={bad}", f"input={image}", f"output_dir={tmp_path / 'out'}"
            )
        )
    with pytest.raises(ConfigError, match=r"ckpt='.*shared\.ckpt' cannot be read"):
        evaluate(
            compose_config(
                "evaluate",
                f"ckpt={bad}",
                "datamodule=folder",
                f"datamodule.source.root={tmp_path / 'data'}",
                f"output_dir={tmp_path}",
            )
        )
    assert not marker.exists()


@pytest.mark.slow
def test_predict_py_says_so_and_exits_2(tmp_path):
    # python predict.py as a process of its own (the other entry points run in this
    # process below): its exit status end to end, and no payload ran in it.
    marker = tmp_path / "ran"
    bad = malicious_checkpoint(tmp_path / "shared.ckpt", marker)
    image = folder_dataset(tmp_path / "data", size=64) / "val" / "images" / "tile0.png"
    result = subprocess.run(
        [sys.executable, str(REPO / "predict.py"), f"ckpt={bad}", f"input={image}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "shared.ckpt' cannot be read as weights" in result.stdout + result.stderr
    assert not marker.exists()


PAYLOAD_TARGETS = [
    ("builtins.open", {"file": "ran"}),
    # Hydra's _locate reaches torch.load through any module that imports torch.
    ("segscale.models.weights.torch.load", {"f": "payload.pt", "weights_only": False}),
    ("torch.nn.modules.module.torch.load", {"f": "payload.pt", "weights_only": False}),
    # A module of torch with no weights to miss: it loaded, then failed predicting.
    ("torch.nn.Identity", {}),
]


@pytest.mark.parametrize(("target", "arguments"), PAYLOAD_TARGETS)
def test_a_checkpoint_whose_metadata_calls_other_code_is_refused(tmp_path, target, arguments):
    marker = tmp_path / "ran"
    torch.save({"payload": WritesAFile(marker)}, tmp_path / "payload.pt")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    content = torch.load(ckpt, weights_only=True)
    content.pop("segscale_sha256")
    paths = {k: str(tmp_path / v) if k in ("file", "f") else v for k, v in arguments.items()}
    content["segscale"]["model"] = {"_target_": target, **paths}
    content["state_dict"] = {}  # weights the network would load: none
    save_checkpoint_file(content, ckpt)  # a valid digest: the file is as its author wrote it
    image = folder_dataset(tmp_path / "data", size=64) / "val" / "images" / "tile0.png"
    out = tmp_path / "out"
    cfg = compose_config("predict", f"ckpt={ckpt}", f"input={image}", f"output_dir={out}")
    with pytest.raises(ConfigError) as refused:
        predict(cfg)
    assert str(refused.value).startswith(
        f"ckpt={str(ckpt)!r}: its segscale.model._target_={target!r} is not a network "
        "segscale builds; expected segscale.models.networks.build_network"
    )
    assert not marker.exists()


def test_every_tool_says_a_text_file_is_not_a_checkpoint(tiny_data_root, tmp_path):
    text = tmp_path / "metrics.ckpt"
    text.write_text("epoch,loss\n0,1.2\n")  # torch.load: IndexError, pop from empty list
    image = folder_dataset(tmp_path / "data", size=64) / "val" / "images" / "tile0.png"
    runs = {
        "train.py": (
            train_py.main,
            [*tiny_overrides(tiny_data_root, None), f"ckpt_path={text}"],
            "ckpt_path",
        ),
        "predict.py": (predict_py.main, [f"ckpt={text}", f"input={image}"], "ckpt"),
        "evaluate.py": (evaluate_py.main, [f"ckpt={text}"], "ckpt"),
        "export.py": (export_py.main, [f"ckpt={text}"], "ckpt"),
    }
    for program, (main, args, key) in runs.items():
        folder = [f"hydra.run.dir={tmp_path / program}"]
        done = run_in_process(main, *args, *folder, cwd=tmp_path, program=program)
        output = done.stdout + done.stderr
        assert done.returncode == 2 and "Traceback" not in output, (program, output[-2000:])
        assert f"{key}={str(text)!r} is not a checkpoint" in output, (program, output[-2000:])
