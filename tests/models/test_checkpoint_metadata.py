import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from segscale.data.labels import LabelMap
from segscale.errors import ConfigError
from segscale.models.checkpoint_io import DIGEST_KEY, content_digest, save_checkpoint_file
from segscale.models.checkpoint_metadata import mask_label_ids
from segscale.models.module import SegmentationModule
from segscale.training.builders import build, build_datamodule, build_module
from tests.conftest import compose_config, tiny_overrides


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_data_root: Path) -> tuple:
    """A module built as train.py builds it, its batch norm statistics moved off their
    initial values, saved as a train.py checkpoint; returns (module, checkpoint path)."""
    folder = tmp_path_factory.mktemp("checkpoint")
    cfg = compose_config("train", *tiny_overrides(tiny_data_root, folder / "run"), "model=unet")
    effective = build(cfg.scaling).resolve(cfg.datamodule.batch_size, cfg.optimizer.lr, 1)
    datamodule = build_datamodule(cfg, effective)
    torch.manual_seed(0)
    module = build_module(cfg, datamodule, effective.learning_rate)
    with torch.no_grad():
        module.train()(torch.rand(2, 3, 64, 64) * 255)
    module.eval()
    checkpoint = {"state_dict": module.state_dict(), "epoch": 1, "global_step": 8}
    module.on_save_checkpoint(checkpoint)  # as Lightning's checkpoint saving calls it
    path = folder / "best.ckpt"
    save_checkpoint_file(checkpoint, path)
    return module, path


def _images() -> torch.Tensor:
    return torch.randint(0, 256, (2, 3, 64, 64), generator=torch.Generator().manual_seed(1))


def test_the_loaded_module_computes_what_the_trained_one_did(trained):
    module, path = trained
    loaded = SegmentationModule.load_from_checkpoint(path)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(_images()), module(_images()))
    assert loaded.class_names == module.class_names
    assert loaded.ignore_index == module.ignore_index
    assert loaded.max_value == module.max_value
    assert torch.equal(loaded.mean, module.mean) and torch.equal(loaded.std, module.std)
    assert loaded.inference_metadata == module.inference_metadata
    meta = loaded.inference_metadata
    assert meta["label_ids"] is None and meta["ignore_ids"] == []  # class-index masks


def test_map_location_moves_the_module(trained):
    _, path = trained
    on_meta = SegmentationModule.load_from_checkpoint(path, map_location="meta")
    assert {p.device.type for p in on_meta.parameters()} == {"meta"}
    on_cpu = SegmentationModule.load_from_checkpoint(path, map_location=torch.device("cpu"))
    assert {p.device.type for p in on_cpu.parameters()} == {"cpu"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_map_location_cuda(trained):
    module, path = trained
    loaded = SegmentationModule.load_from_checkpoint(path, map_location="cuda")
    assert {p.device.type for p in loaded.parameters()} == {"cuda"}
    # cuDNN runs float32 convolutions in TF32 by default (10-bit mantissa: 6.7e-3 apart
    # from the CPU here, measured on an H200); in full float32 the CPU's tolerance holds.
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        on_gpu = loaded.eval()(_images().cuda()).cpu()
        torch.testing.assert_close(on_gpu, module(_images()), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kwargs", [{"strict": False}, {"num_classes": 4, "lr": 0.1}])
def test_hyperparameter_arguments_are_refused(trained, kwargs):
    _, path = trained
    with pytest.raises(TypeError, match="unexpected arguments"):
        SegmentationModule.load_from_checkpoint(path, **kwargs)


@pytest.mark.parametrize("classes", ["potsdam", "potsdam_rgb", "binary"])
def test_the_label_ids_stored_are_those_of_the_classes_file(classes: str):
    data = compose_config("train", f"datamodule/classes={classes}").datamodule
    labels = LabelMap(data.num_classes, data.ignore_index, data.label_ids, data.ignore_ids)
    file = OmegaConf.to_container(data, resolve=True)
    assert mask_label_ids(labels) == (file["label_ids"], file["ignore_ids"])


def test_the_label_ids_stored_keep_several_values_per_class_and_ignored_colours():
    assert mask_label_ids(LabelMap(2, 255, [[1, 2], 3], [7, 255])) == ([[1, 2], 3], [7])
    assert mask_label_ids(LabelMap(2, 255, None, [9])) == (None, [9])
    colours = LabelMap(1, 255, [[[1, 2, 3], [4, 5, 6]]], [[0, 0, 0]])
    assert mask_label_ids(colours) == ([[[1, 2, 3], [4, 5, 6]]], [[0, 0, 0]])


def _changed(content: dict) -> dict:
    content["state_dict"]["network.segmentation_head.0.bias"] += 1
    return content  # the digest stays that of the original content


def _undigested(content: dict) -> dict:
    del content[DIGEST_KEY]
    return content


def _without_metadata(content: dict) -> dict:
    return _sealed({k: v for k, v in content.items() if k != "segscale"})


def _code_as_network(content: dict) -> dict:
    content["segscale"]["model"] = {"_target_": "os.system", "command": "echo owned"}
    return _sealed(content)


def _other_network(content: dict) -> dict:
    content["segscale"]["model"]["encoder"] = "resnet34"
    return _sealed(content)


def _bad_label_ids(content: dict) -> dict:
    content["segscale"]["label_ids"] = "0,255"
    return _sealed(content)


def _sealed(content: dict) -> dict:
    """``content`` with a digest of its own: intact as a file, foreign as a checkpoint."""
    content.pop(DIGEST_KEY, None)
    return {**content, DIGEST_KEY: content_digest(content)}


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_changed, "is damaged"),
        (_undigested, "carries no content digest"),
        (_without_metadata, "is not a segscale checkpoint"),
        (_bad_label_ids, r"lacks \['label_ids'\]"),
        (_code_as_network, r"_target_='os\.system'"),
        (_other_network, r"does not fit the network"),
    ],
)
def test_damaged_or_foreign_checkpoints_are_refused_naming_the_file(
    trained, tmp_path: Path, damage, message: str
):
    _, path = trained
    content = torch.load(path, weights_only=True)
    copy = tmp_path / "copy.ckpt"
    torch.save(damage(content), copy)
    with pytest.raises(ConfigError, match=rf"weights='{re.escape(str(copy))}'.*{message}"):
        SegmentationModule.load_from_checkpoint(copy, key="weights")


@pytest.mark.parametrize("data", [None, b"\x89PNG\r\n\x1a\n not weights", b""])
def test_missing_and_unreadable_files_are_refused_naming_them(tmp_path: Path, data):
    path = tmp_path / "model.ckpt"
    if data is not None:
        path.write_bytes(data)
    with pytest.raises(ConfigError, match=rf"checkpoint_path='{re.escape(str(path))}'"):
        SegmentationModule.load_from_checkpoint(path)
