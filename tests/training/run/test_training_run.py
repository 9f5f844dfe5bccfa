import json
import logging

import pytest
import torch
from omegaconf import OmegaConf

from segscale.models.checkpoint.files import save_checkpoint_file
from segscale.runs.builders import build
from segscale.training.run.training_run import train
from tests.conftest import full_record
from tests.helpers.record_dtype import recorded_dtypes

# The tiny config trains 2 epochs of 4 iterations each (see tests/conftest.py).


def read_metrics(path):
    rows = path.read_text().splitlines()
    header = rows[0].split(",")
    return [dict(zip(header, row.split(","), strict=True)) for row in rows[1:]]


@pytest.mark.slow
def test_validation_patience_stops_training(make_config, tmp_path):
    # min_delta=1000: no validation after the first counts as an improvement.
    summary = train(
        make_config(
            "trainer.max_epochs=5",
            "callbacks.early_stopping.patience=1",
            "+callbacks.early_stopping.min_delta=1000",
        )
    )
    assert summary["epochs"] == 2 and summary["steps"] == 8
    patient = train(
        make_config(
            "trainer.max_epochs=3",
            "+callbacks.early_stopping.min_delta=1000",
            f"output_dir={tmp_path / 'patient'}",  # a run folder holds one run
        )
    )
    assert patient["steps"] == 12  # patience .inf: never stops early


def test_validation_frequency_in_iterations(make_config, tmp_path):
    train(make_config("trainer.val_check_interval=3", "trainer.check_val_every_n_epoch=null"))
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    assert [int(r["step"]) for r in rows if r["val/mIoU"]] == [2, 5]  # after iterations 3 and 6


def test_mixed_precision_and_channels_last_train(make_config, tmp_path):
    dtypes = tmp_path / "dtypes.json"
    summary = train(
        make_config(
            "trainer.precision=bf16-mixed",
            "training.channels_last=true",
            "trainer.max_epochs=1",
            "+callbacks.dtype._target_=tests.helpers.record_dtype.RecordOutputDtype",
            f"+callbacks.dtype.path={dtypes}",
        )
    )
    assert summary["steps"] == 4 and summary["metrics"]["train/loss"] > 0
    # The network computed in bfloat16 inside the training step (autocast was on).
    assert recorded_dtypes(dtypes) == ["torch.bfloat16"]


def write_init_checkpoint(cfg, path):
    """A segscale checkpoint of ``cfg``'s network for 2 classes, and its parameters."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("init_from")
    model["num_classes"] = 2
    torch.manual_seed(7)
    network = build(OmegaConf.create(model))
    meta = {
        "model": model,
        "class_names": ["a", "b"],
        "class_colors": None,
        "ignore_index": 255,
        "mean": list(cfg.datamodule.mean),
        "std": list(cfg.datamodule.std),
        "max_value": 255.0,
    }
    state = {f"network.{k}": v for k, v in network.state_dict().items()}
    save_checkpoint_file({"state_dict": state, "segscale": full_record(meta)}, path)
    return {k: v.detach().clone() for k, v in network.named_parameters()}


def network_parameters(path):
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    return {k.removeprefix("network."): v for k, v in state.items() if k.startswith("network.")}


@pytest.mark.slow
def test_init_from_with_a_frozen_encoder_and_a_resume_that_does_not_read_it(
    make_config, tmp_path, caplog
):
    source = tmp_path / "source.ckpt"
    settings = [
        f"model.init_from={source}",
        "datamodule.mean=null",  # init_from's, which the resume takes from its checkpoint
        "datamodule.std=null",
        "training.freeze_encoder_epochs=1",
        "training.encoder_lr_factor=0.5",
        "datamodule.patches_per_image=4",  # 2 steps an epoch
        "trainer.max_epochs=1",
    ]
    loaded = write_init_checkpoint(make_config(), source)
    with caplog.at_level(logging.INFO):
        train(make_config(*settings))
    assert "the checkpoint has 2 classes, this run 6: re-initialised segmentation_head" in (
        caplog.text
    )
    trained = network_parameters(tmp_path / "run/checkpoints/last.ckpt")
    # The stored network config rebuilds without the file (evaluate.py, predict.py).
    meta = torch.load(tmp_path / "run/checkpoints/last.ckpt", weights_only=True)["segscale"]
    assert "init_from" not in meta["model"]
    encoder = [k for k in loaded if k.startswith("encoder.")]
    decoder = [k for k in loaded if k.startswith("decoder.")]
    assert encoder and all(torch.equal(trained[k], loaded[k]) for k in encoder)  # frozen
    assert any(not torch.equal(trained[k], loaded[k]) for k in decoder)  # loaded, then trained
    # A resume takes its weights from ckpt_path: the init_from file is not read again.
    source.unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        train(make_config(*settings[:-1], "trainer.max_epochs=2", "ckpt_path=last"))
    assert "re-initialised" not in caplog.text and "every layer loaded" not in caplog.text
    assert "datamodule mean/std null: the resumed checkpoint's" in caplog.text


def test_ohem_lovasz_and_label_smoothing_train(make_config, tmp_path):
    summary = train(
        make_config(
            "loss=ohem",
            "loss.label_smoothing=0.1",
            "loss.lovasz=0.5",
            "loss.ohem_min_kept=100",
            "datamodule.patches_per_image=4",
            "trainer.max_epochs=1",
        )
    )
    assert summary["steps"] == 2 and 0 < summary["metrics"]["train/loss"] < 100


@pytest.mark.slow
def test_the_nodata_found_is_in_train_log_and_summary_json(tmp_path, caplog):
    from tests.conftest import TINY_ENCODER, compose_config
    from tests.helpers.valid_maps import tagged_border_dataset

    root, out = tmp_path / "data", tmp_path / "run"
    tagged_border_dataset(root)
    cfg = compose_config(
        "train",
        f"output_dir={out}",
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "datamodule/classes=auto",
        "datamodule.patch_size=32",
        "datamodule.patches_per_image=2",
        "datamodule.batch_size=4",
        "datamodule.num_workers=0",
        "datamodule.sampling.min_valid=0.6",
        f"model.encoder={TINY_ENCODER}",
        "trainer.max_epochs=1",
        "trainer.accelerator=cpu",
    )
    with caplog.at_level(logging.INFO):
        summary = train(cfg)
    assert "no-data (each GeoTIFF's GDAL_NODATA tag; datamodule.sampling.nodata=null):" in (
        caplog.text
    )
    assert "candidate windows of 32 px with datamodule.sampling.min_valid=0.6: 15 of 24" in (
        caplog.text
    )
    written = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert written["nodata"] == summary["nodata"]
    nodata = written["nodata"]
    assert nodata["setting"] is None and nodata["min_valid"] == 0.6
    train_split = nodata["splits"]["train"]
    assert (train_split["images_with_value"], train_split["nodata_pixels"]) == (2, 4416)
    assert train_split["windows"] == {"qualifying": 9 + 6, "candidates": 24}
    assert [(i["image"].rsplit("/", 1)[-1], i["pixels"]) for i in train_split["per_image"]] == [
        ("t1.tif", 1760),
        ("t2.tif", 2656),
    ]
    assert train_split["per_image"][0]["windows"] == {"qualifying": 9, "candidates": 12}
    assert nodata["splits"]["val"]["per_image"][0]["from"] == "GDAL_NODATA"
