import sys
from typing import Any

import pytest
import timm
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torch import nn

from segscale.errors import ConfigError
from segscale.models.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from segscale.runs.builders import (
    build,
    build_datamodule,
    build_module,
    build_strategy,
    strategy_backend,
    weights_normalization,
)
from segscale.training.run_folder.resume import read_resumed
from tests.conftest import compose_config
from tests.models.checkpoint.test_init_from import MEAN, STD, trained_checkpoint
from tests.runs.scaling.test_sync_batchnorm import ScaledBatchNorm

FOLDER = ["datamodule=folder", "datamodule.source.root=/nowhere", "output_dir=/tmp/x"]


def test_named_weights_give_a_null_mean_and_std_their_own():
    # timm's pretrained config is local metadata: nothing is fetched
    cfg = compose_config(
        "train", *FOLDER, "model.encoder=tu-resnet18", "model.encoder_weights=imagenet"
    )
    expected = timm.models.get_pretrained_cfg("resnet18").to_dict()
    assert cfg.datamodule.mean is None and cfg.datamodule.std is None
    assert weights_normalization(cfg) == {
        "mean": pytest.approx(list(expected["mean"])),
        "std": pytest.approx(list(expected["std"])),
    }


def test_a_mean_or_std_the_user_set_is_kept():
    cfg = compose_config(
        "train",
        *FOLDER,
        "model.encoder=tu-resnet18",
        "model.encoder_weights=imagenet",
        "datamodule.mean=[0.5,0.5,0.5]",
    )
    assert list(weights_normalization(cfg)) == ["std"]


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # random initialization: the training images' statistics, as before
        ["model.encoder_weights=/weights/resnet18.pth"],  # a file: no name to ask
        ["model.encoder_weights=imagenet", "datamodule.in_channels=4"],
    ],
)
def test_otherwise_nothing_changes(overrides):
    assert weights_normalization(compose_config("train", *FOLDER, *overrides)) == {}


def network_with_scaled_batchnorm(**_: Any) -> nn.Module:
    """A ``model._target_``: a network with a ``ScaledBatchNorm``."""
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), ScaledBatchNorm(6))


def test_a_network_sync_batch_norm_cannot_convert_is_a_config_error(make_config):
    cfg = make_config(f"model._target_={__name__}.network_with_scaled_batchnorm")
    effective = build(cfg.scaling).resolve(cfg.datamodule.batch_size, cfg.optimizer.lr, 2)
    datamodule = build_datamodule(cfg, effective)
    with pytest.raises(
        ConfigError,
        match=r"cannot synchronize 1 \(.*ScaledBatchNorm\).*"
        r"training\.sync_batchnorm=false",
    ):
        build_module(cfg, datamodule, effective.learning_rate, sync_batchnorm=True)
    assert build_module(cfg, datamodule, effective.learning_rate)  # off: it trains as built


def test_init_from_gives_a_null_mean_and_std_the_checkpoints(tmp_path):
    path, _ = trained_checkpoint(tmp_path / "source.ckpt", ["a", "b", "c"])
    cfg = compose_config("train", *FOLDER, f"model.init_from={path}", "datamodule.std=[1,1,1]")
    assert weights_normalization(cfg) == {"mean": MEAN}  # std was set: kept, checked later


def test_init_from_with_named_encoder_weights_is_refused_before_anything_is_read():
    cfg = compose_config(
        "train", *FOLDER, "model.init_from=/nowhere.ckpt", "model.encoder_weights=imagenet"
    )
    with pytest.raises(ConfigError, match=r"model\.init_from=.*model\.encoder_weights"):
        weights_normalization(cfg)


def test_a_resume_keeps_its_checkpoint_s_normalization_and_reads_no_init_from(tmp_path):
    # The run took its null mean/std from model.init_from, a file since gone: the
    # resumed checkpoint records them, and holds the whole network.
    resumed, _ = trained_checkpoint(tmp_path / "last.ckpt", ["a", "b", "c"])
    cfg = compose_config("train", *FOLDER, f"model.init_from={tmp_path / 'gone.ckpt'}")
    assert weights_normalization(cfg, read_resumed(str(resumed))) == {"mean": MEAN, "std": STD}
    with pytest.raises(ConfigError, match=r"model\.init_from='.*gone\.ckpt'"):
        weights_normalization(cfg)  # a fresh run reads it


def test_a_resume_from_a_checkpoint_without_a_record_says_its_init_from_is_gone(tmp_path):
    path, _ = trained_checkpoint(tmp_path / "last.ckpt", ["a", "b", "c"])
    content = load_checkpoint_file(path, "ckpt")
    del content["segscale"]  # a module built without segscale's record
    save_checkpoint_file(content, path)
    gone = tmp_path / "gone.ckpt"
    cfg = compose_config("train", *FOLDER, f"model.init_from={gone}")
    with pytest.raises(ConfigError) as refused:
        weights_normalization(cfg, read_resumed(str(path)))
    assert f"ckpt_path='{path}': the resumed run's model.init_from='{gone}' names a file" in str(
        refused.value
    )
    assert "put that file back" in str(refused.value)


def test_a_resume_builds_its_network_without_reading_encoder_weights(make_config):
    # The checkpoint holds every weight: a file gone (or named weights offline) is not read.
    cfg = make_config("model.encoder_weights=/nowhere/encoder.pth")
    effective = build(cfg.scaling).resolve(cfg.datamodule.batch_size, cfg.optimizer.lr, 1)
    datamodule = build_datamodule(cfg, effective)
    assert build_module(cfg, datamodule, effective.learning_rate, init_weights=False)
    with pytest.raises(ConfigError, match=r"model\.encoder_weights='/nowhere/encoder\.pth'"):
        build_module(cfg, datamodule, effective.learning_rate)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
@pytest.mark.parametrize(
    ("platform", "accelerator", "overrides", "backend"),
    [
        ("linux", "gpu", [], "nccl"),
        ("linux", "gpu", ["strategy.process_group_backend=gloo"], "gloo"),
        ("linux", "cpu", [], "gloo"),
        ("darwin", "cpu", [], "gloo"),
        ("win32", "gpu", [], "gloo"),  # Lightning's own null: NCCL, which Windows lacks
        ("win32", "cpu", ["strategy.process_group_backend=gloo"], "gloo"),
    ],
)
def test_the_built_strategy_talks_through_the_platforms_backend_or_the_one_given(
    strategy, platform, accelerator, overrides, backend, monkeypatch
):
    cfg = compose_config(
        "train", *FOLDER, f"strategy={strategy}", f"trainer.accelerator={accelerator}", *overrides
    )
    monkeypatch.setattr(sys, "platform", platform)
    built = build_strategy(cfg)  # the object only: no process started, no group joined
    assert isinstance(built, DDPStrategy)
    assert built.process_group_backend == backend
    assert built._get_process_group_backend() == backend  # what Lightning will init with


def test_a_strategy_without_a_backend_is_built_as_configured():
    cfg = compose_config("train", *FOLDER, "strategy=single", "trainer.accelerator=cpu")
    assert strategy_backend(cfg) == {}
    assert isinstance(build_strategy(cfg), SingleDeviceStrategy)
