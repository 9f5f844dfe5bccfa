import logging
from pathlib import Path

import pytest
import torch

from segscale.errors import ConfigError
from segscale.models.checkpoint.files import save_checkpoint_file
from segscale.models.checkpoint.init_from import check_one_initialisation, load_whole_network
from segscale.models.networks import build_network
from tests.conftest import TINY_ENCODER, full_record

MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.2, 0.2]
NORMALIZATION = {"mean": MEAN, "std": STD}


def model_cfg(num_classes: int = 3, **changes) -> dict:
    """A run's network config, as build_module has it (in_channels resolved)."""
    return {
        "_target_": "segscale.models.networks.build_network",
        "arch": "FPN",
        "encoder": TINY_ENCODER,
        "encoder_weights": None,
        "num_classes": num_classes,
        "in_channels": 3,
        "decoder_pyramid_channels": 16,
        "decoder_segmentation_channels": 32,
    } | changes


def unet_cfg(**changes) -> dict:
    """``model_cfg`` of a U-Net: without FPN's decoder keys."""
    cfg = model_cfg(arch="Unet", decoder_channels=[16, 16, 8, 8, 8], **changes)
    return {k: v for k, v in cfg.items() if not k.startswith("decoder_") or k == "decoder_channels"}


def build(cfg: dict) -> torch.nn.Module:
    return build_network(**{k: v for k, v in cfg.items() if k not in ("_target_", "init_from")})


def trained_checkpoint(path: Path, classes: list[str], **changes) -> tuple[Path, dict]:
    """A segscale checkpoint of a network of ``model_cfg``, and that network's weights."""
    cfg = model_cfg(len(classes), **changes)
    torch.manual_seed(1)
    network = build(cfg)
    state = {k: v.clone() for k, v in network.state_dict().items()}
    meta = {
        "model": cfg,
        "class_names": classes,
        "class_colors": None,
        "ignore_index": 255,
        "mean": MEAN,
        "std": STD,
        "max_value": 255.0,
    }
    checkpoint = {
        "state_dict": {f"network.{k}": v for k, v in state.items()},
        "segscale": full_record(meta),
    }
    save_checkpoint_file(checkpoint, path)
    return path, state


def fresh(cfg: dict) -> torch.nn.Module:
    torch.manual_seed(2)
    return build(cfg)


def test_every_layer_is_loaded_when_the_network_and_classes_are_the_checkpoints(tmp_path, caplog):
    path, state = trained_checkpoint(tmp_path / "a.ckpt", ["a", "b", "c"])
    network = fresh(model_cfg())
    with caplog.at_level(logging.INFO):
        load_whole_network(network, model_cfg(init_from=str(path)), ["a", "b", "c"], NORMALIZATION)
    assert all(torch.equal(v, state[k]) for k, v in network.state_dict().items())
    assert "every layer loaded" in caplog.text


def test_other_classes_keep_a_new_head_and_load_the_rest(tmp_path, caplog):
    path, state = trained_checkpoint(tmp_path / "a.ckpt", ["a", "b", "c", "d", "e"])
    network = fresh(model_cfg(2))
    new_head = {k: v.clone() for k, v in network.state_dict().items() if "head" in k}
    with caplog.at_level(logging.WARNING):
        load_whole_network(network, model_cfg(2, init_from=str(path)), ["x", "y"], NORMALIZATION)
    loaded = network.state_dict()
    head = [k for k in loaded if k.startswith("segmentation_head.")]
    assert head and all(torch.equal(loaded[k], new_head[k]) for k in head)
    assert all(torch.equal(v, state[k]) for k, v in loaded.items() if k not in head)
    assert "5 classes, this run 2" in caplog.text
    assert all(k in caplog.text for k in head)


def test_other_class_names_of_the_same_count_load_with_a_warning(tmp_path, caplog):
    path, state = trained_checkpoint(tmp_path / "a.ckpt", ["road", "car", "tree"])
    network = fresh(model_cfg())
    with caplog.at_level(logging.WARNING):
        load_whole_network(network, model_cfg(init_from=str(path)), ["a", "b", "c"], NORMALIZATION)
    assert all(torch.equal(v, state[k]) for k, v in network.state_dict().items())
    assert "['road', 'car', 'tree'] are not this run's ['a', 'b', 'c']" in caplog.text


@pytest.mark.parametrize(
    ("run", "named"),
    [
        (unet_cfg(), "arch='FPN', this run's model.arch is 'Unet'"),
        (model_cfg(encoder="resnet18"), f"encoder={TINY_ENCODER!r}, this run's model.encoder"),
        (model_cfg(in_channels=4), "in_channels=3, this run's have 4"),
        (model_cfg(decoder_pyramid_channels=24), "does not fit the network FPN"),
    ],
)
def test_another_network_is_refused_naming_both(tmp_path, run, named):
    path, _ = trained_checkpoint(tmp_path / "a.ckpt", ["a", "b", "c"])
    cfg = run | {"init_from": str(path)}
    network = build(cfg)
    with pytest.raises(ConfigError, match=r"model\.init_from") as error:
        load_whole_network(network, cfg, ["a", "b", "c"], NORMALIZATION)
    assert named in str(error.value)


@pytest.mark.parametrize("key", ["mean", "std"])
def test_another_normalization_is_refused_with_both_values(tmp_path, key):
    path, _ = trained_checkpoint(tmp_path / "a.ckpt", ["a", "b", "c"])
    cfg = model_cfg(init_from=str(path))
    other = NORMALIZATION | {key: [0.1, 0.1, 0.1]}
    with pytest.raises(ConfigError) as error:
        load_whole_network(fresh(cfg), cfg, ["a", "b", "c"], other)
    message = str(error.value)
    assert f"{key}={NORMALIZATION[key]}" in message and "[0.1, 0.1, 0.1]" in message
    assert f"datamodule.{key}=null" in message


def test_init_from_with_encoder_weights_is_refused_naming_both():
    cfg = {"init_from": "run/last.ckpt", "encoder_weights": "imagenet"}
    with pytest.raises(ConfigError, match=r"model\.init_from=.*model\.encoder_weights=.imagenet."):
        check_one_initialisation(cfg)
    check_one_initialisation({"init_from": None, "encoder_weights": "imagenet"})


def test_a_file_that_is_no_segscale_checkpoint_is_refused(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "plain.ckpt")
    cfg = model_cfg(init_from=str(tmp_path / "plain.ckpt"))
    with pytest.raises(ConfigError, match=r"model\.init_from=.*digest"):
        load_whole_network(fresh(cfg), cfg, ["a", "b", "c"], NORMALIZATION)
