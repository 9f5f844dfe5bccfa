import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

import segscale
from segscale.cli.predict import main as predict_main
from segscale.data.classes.labels import LabelMap
from segscale.errors import ConfigError
from segscale.models.checkpoint.files import DIGEST_KEY, content_digest, save_checkpoint_file
from segscale.models.checkpoint.record import CHECKPOINT_FORMAT, mask_label_ids, run_record
from segscale.models.checkpoint.trained import load_trained
from segscale.models.module import SegmentationModule
from segscale.runs.builders import build, build_datamodule, build_module
from tests.conftest import compose_config, folder_dataset, oracle_checkpoint, tiny_overrides
from tests.helpers.in_process import run_in_process


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


def _edited(path: Path, tmp_path: Path, **entries) -> Path:
    """A copy of the checkpoint at ``path`` with metadata ``entries`` replaced, resealed."""
    content = torch.load(path, weights_only=True)
    content["segscale"].update(entries)
    copy = tmp_path / "edited.ckpt"
    torch.save(_sealed(content), copy)
    return copy


NONSENSE = [
    ({"mean": [float("nan"), 0.0, 0.0]}, r"mean=\[nan, 0\.0, 0\.0\]: expected finite numbers"),
    ({"mean": [0.0, 0.0]}, r"mean=\[0\.0, 0\.0\]: expected 3 numbers"),
    ({"std": [0.0, 1.0, 1.0]}, r"std=\[0\.0, 1\.0, 1\.0\]: expected positive numbers"),
    ({"std": [1.0, float("inf"), 1.0]}, r"std=.*expected finite numbers"),
    ({"max_value": 0.0}, r"max_value=0\.0: expected a positive finite number"),
    ({"class_names": ["a", "b"]}, r"class_names: 2 names for a network of 3 classes"),
    ({"class_names": ["a", "a", "b"]}, r"class_names=.*expected distinct names"),
    ({"class_colors": [[0, 0, 0]]}, r"class_colors=.*expected 3 RGB triplets"),
    ({"class_colors": [[0, 0, 0], [1, 1, 1], [2, 2, 999]]}, r"class_colors=.*0 to 255"),
    ({"ignore_index": 1}, r"ignore_index=1: expected a mask value that no class has \(3 to"),
    ({"ignore_index": 300}, r"ignore_index=300: expected"),
    ({"label_ids": [0, 128]}, r"label_ids/ignore_ids: .*2 entries for 3 classes"),
    ({"label_ids": [0, 0, 255], "ignore_ids": []}, r"mask value 0 is given for two classes"),
    ({"label_ids": [0, [1, 2, 3], 9], "ignore_ids": []}, r"mix grey levels and RGB"),
    ({"value_range": [[0.0, 1.0]]}, r"value_range=\[\[0\.0, 1\.0\]\]: expected 3 \[low, high\]"),
    ({"value_range": [[1.0, 0.0]] * 3}, r"value_range=.*low above high"),
    ({"value_range": [[0.0, float("inf")]] * 3}, r"value_range=.*finite numbers"),
    ({"validation_inference": {"tile_size": 0}}, r"validation_inference\.tile_size=0: expected"),
    ({"validation_inference": {"tile_size": "63"}}, r"validation_inference\.tile_size='63'"),
    ({"validation_inference": {"tile_size": True}}, r"validation_inference\.tile_size=True"),
    ({"validation_inference": {}}, r"validation_inference\.tile_size=None: expected the valid"),
]


@pytest.mark.parametrize(("entries", "message"), NONSENSE)
def test_metadata_that_makes_no_sense_is_refused_naming_the_key(tmp_path, entries, message):
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    edited = _edited(ckpt, tmp_path, **entries)
    expected = rf"ckpt='{re.escape(str(edited))}': its metadata makes no sense: .*{message}"
    with pytest.raises(ConfigError, match=expected):
        load_trained(edited)


@pytest.mark.parametrize(
    ("entries", "code"), [({"mean": [float("nan")] * 3}, 2), ({"std": [0.0] * 3}, 2), ({}, 0)]
)
def test_predict_py_refuses_nonsense_metadata(tmp_path, entries, code):
    ckpt = _edited(oracle_checkpoint(tmp_path / "oracle.ckpt"), tmp_path, **entries)
    image = folder_dataset(tmp_path / "data", size=64) / "val" / "images" / "tile0.png"
    args = (f"ckpt={ckpt}", f"input={image}", f"output_dir={tmp_path / 'out'}")
    result = run_in_process(predict_main, *args, cwd=tmp_path, program="predict.py")
    output = result.stdout + result.stderr
    assert result.returncode == code, output[-2000:]
    assert "Traceback" not in output
    if code:
        assert f"ckpt='{ckpt}': its metadata makes no sense: {next(iter(entries))}=" in output


def test_checkpoints_record_the_training_images_value_range(trained):
    module, path = trained
    recorded = module.inference_metadata["value_range"]
    assert len(recorded) == 3 and all(0 <= low < high <= 255 for low, high in recorded)
    assert load_trained(path).value_range.record() == recorded


def test_checkpoints_record_their_format_and_the_segscale_that_wrote_them(trained):
    module, path = trained
    assert module.inference_metadata["checkpoint_format"] == CHECKPOINT_FORMAT
    assert module.inference_metadata["segscale_version"] == segscale.__version__
    assert SegmentationModule.load_from_checkpoint(path).inference_metadata == (
        module.inference_metadata
    )


def _of_format(path: Path, tmp_path: Path, found: object) -> Path:
    """A copy of the checkpoint at ``path`` of format ``found`` (``None``: without one)."""
    edited = _edited(path, tmp_path, checkpoint_format=found, segscale_version="9.0")
    if found is None:
        content = torch.load(edited, weights_only=True)
        del content["segscale"]["checkpoint_format"]
        torch.save(_sealed(content), edited)
    return edited


@pytest.mark.parametrize(
    ("found", "shown"),
    [
        (CHECKPOINT_FORMAT + 1, f"checkpoint_format={CHECKPOINT_FORMAT + 1}"),
        (None, "no checkpoint_format"),
        ("1", "checkpoint_format='1'"),
        # equal to 1 in Python, but not the number segscale writes
        (True, "checkpoint_format=True"),
        (1.0, "checkpoint_format=1.0"),
    ],
)
def test_a_checkpoint_of_another_format_or_none_is_refused_naming_both(
    trained, tmp_path, found, shown
):
    _, path = trained
    other = _of_format(path, tmp_path, found)
    expected = (
        rf"ckpt='{re.escape(str(other))}' has {re.escape(shown)} \(written by segscale 9\.0\); "
        rf"this segscale .* reads checkpoint_format={CHECKPOINT_FORMAT} only"
    )
    with pytest.raises(ConfigError, match=expected):
        load_trained(other)


def test_predict_py_refuses_a_checkpoint_of_another_format(trained, tmp_path):
    _, path = trained
    ckpt = _of_format(path, tmp_path, CHECKPOINT_FORMAT + 1)
    image = folder_dataset(tmp_path / "data", size=64) / "val" / "images" / "tile0.png"
    args = (f"ckpt={ckpt}", f"input={image}", f"output_dir={tmp_path / 'out'}")
    result = run_in_process(predict_main, *args, cwd=tmp_path, program="predict.py")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-2000:]
    assert f"has checkpoint_format={CHECKPOINT_FORMAT + 1}" in output
    assert f"reads checkpoint_format={CHECKPOINT_FORMAT} only" in output
    assert "Traceback" not in output


def test_a_checkpoint_never_fetches():
    datamodule = SimpleNamespace(
        class_names=["a"],
        class_colors=None,
        ignore_index=255,
        mean=[0.5],
        std=[0.5],
        max_value=1,
        labels=LabelMap(1),
        patch_size=64,
        value_range=None,
    )
    source = OmegaConf.create({"_target_": "segscale.data.datasets.synthetic.SyntheticTiles"})
    metadata = run_record({"encoder_weights": "imagenet"}, datamodule, source)
    assert metadata["model"]["encoder_weights"] is None
