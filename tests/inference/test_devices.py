"""predict.py's and evaluate.py's ranks: the backend they talk through, given to Fabric."""

import sys
from pathlib import Path

import numpy as np
import pytest
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy, SingleDeviceStrategy
from PIL import Image

from segscale.errors import ConfigError
from segscale.inference.devices import inference_backend, run_on_devices
from segscale.inference.evaluation import run as evaluation
from segscale.inference.prediction import run as prediction
from tests.conftest import compose_config, oracle_checkpoint, oracle_image, write_pair


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[Fabric]:
    """The Fabrics ``run_on_devices`` builds, kept instead of launched (no process starts)."""
    fabrics: list[Fabric] = []

    def keep(fabric: Fabric, function: object) -> None:
        fabrics.append(fabric)

    monkeypatch.setattr(Fabric, "launch", keep)
    return fabrics


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_several_devices_spawn_ranks_that_talk_through_the_backend_given(launched, backend):
    # nccl on CPUs would fail once launched; built, it shows the value is Fabric's own
    # and not Lightning's null (gloo on CPUs).
    run_on_devices("cpu", 2, backend, print, [])
    strategy = launched[0].strategy
    assert isinstance(strategy, DDPStrategy) and strategy._start_method == "spawn"
    assert strategy.process_group_backend == backend
    assert strategy._get_process_group_backend() == backend
    assert strategy.num_processes == 2


def test_one_device_runs_in_this_process_without_a_group(launched):
    run_on_devices("cpu", 1, "gloo", print, [])
    assert isinstance(launched[0].strategy, SingleDeviceStrategy)


@pytest.mark.parametrize("command", ["predict", "evaluate"])
@pytest.mark.parametrize(
    ("platform", "accelerator", "given", "backend"),
    [
        ("linux", "gpu", "null", "nccl"),
        ("linux", "gpu", "gloo", "gloo"),
        ("linux", "cpu", "null", "gloo"),
        ("darwin", "cpu", "null", "gloo"),
        ("win32", "gpu", "null", "gloo"),
    ],
)
def test_null_is_the_platforms_backend_and_a_given_one_is_kept(
    command, platform, accelerator, given, backend, monkeypatch
):
    cfg = compose_config(
        command, f"accelerator={accelerator}", f"process_group_backend={given}", "ckpt=x"
    )
    monkeypatch.setattr(sys, "platform", platform)
    assert inference_backend(cfg) == backend


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_nccl_on_windows_is_refused_naming_the_key(command, monkeypatch):
    cfg = compose_config(command, "accelerator=gpu", "process_group_backend=nccl", "ckpt=x")
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(ConfigError, match=r"^process_group_backend='nccl' is not allowed: Windows"):
        inference_backend(cfg)


def _handed_over(monkeypatch: pytest.MonkeyPatch, module: object, result: object) -> list[str]:
    """The backends ``module`` hands ``run_on_devices``, which returns ``result`` instead."""
    backends: list[str] = []

    def instead(accelerator: str, devices: int, backend: str, *args: object) -> object:
        backends.append(backend)
        return result

    monkeypatch.setattr(module, "run_on_devices", instead)
    return backends


def test_predict_hands_its_ranks_the_backend_it_resolved(tmp_path, monkeypatch):
    (tmp_path / "in").mkdir()
    Image.fromarray(oracle_image(np.zeros((8, 8), np.uint8))).save(tmp_path / "in" / "a.png")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    backends = _handed_over(monkeypatch, prediction, ([], []))
    for given, out in (("null", "one"), ("gloo", "two")):
        cfg = compose_config(
            "predict",
            "accelerator=cpu",
            "devices=2",
            f"process_group_backend={given}",
            f"ckpt={ckpt}",
            f"input={tmp_path / 'in'}",
            f"output_dir={tmp_path / out}",
        )
        prediction.run_prediction(cfg)
    assert backends == ["gloo", "gloo"]


def test_evaluate_hands_its_ranks_the_backend_it_resolved(tmp_path, monkeypatch):
    mask = np.zeros((8, 8), np.uint8)
    write_pair(tmp_path / "data", "val", "a", oracle_image(mask), mask)
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    backends = _handed_over(monkeypatch, evaluation, [])
    cfg = compose_config(
        "evaluate",
        "datamodule=folder",
        f"datamodule.source.root={tmp_path / 'data'}",
        "other_data=true",  # not the oracle's
        "accelerator=cpu",
        "devices=2",
        f"ckpt={ckpt}",
        f"output_dir={tmp_path / 'out'}",
        "inference.tile_size=32",
    )
    evaluation.evaluate(cfg)
    assert backends == ["gloo"]


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_a_bad_backend_is_refused_before_the_checkpoint_is_read(command, tmp_path: Path):
    cfg = compose_config(
        command,
        "accelerator=cpu",
        "process_group_backend=NCCL",
        f"ckpt={tmp_path / 'missing.ckpt'}",  # read later: its error would come first
        f"input={tmp_path}" if command == "predict" else "split=val",
        f"output_dir={tmp_path / 'out'}",
    )
    run = prediction.run_prediction if command == "predict" else evaluation.evaluate
    with pytest.raises(ConfigError, match=r"^process_group_backend='NCCL' is not allowed: not a"):
        run(cfg)
