import logging
import math
import statistics
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from segscale.bench.measure import overhead
from segscale.bench.measure.overhead import (
    Overhead,
    RoundClock,
    measure_overhead,
    quiet,
    tiny_module,
)
from segscale.runs.builders import instantiate_each

CPU = torch.device("cpu")


@pytest.mark.parametrize("warmup", [0, 2])
def test_a_tiny_run_times_both_sides_with_train_py_callbacks_and_logger(
    make_config, tmp_path, warmup
):
    cfg = make_config()
    result = measure_overhead(cfg, CPU, steps=3, rounds=2, warmup=warmup)

    assert isinstance(result, Overhead) and result.steps == 3
    for value in (result.lightning_ms, result.bare_ms):
        assert value > 0 and math.isfinite(value)
    assert len(result.rounds_ms) == 2 and all(math.isfinite(d) for d in result.rounds_ms)
    assert result.overhead_ms == pytest.approx(statistics.median(result.rounds_ms))
    assert result.spread_ms == pytest.approx(
        statistics.median(abs(d - result.overhead_ms) for d in result.rounds_ms)
    )
    # Every callback of the callbacks group, the run summary, the configured bar and logger.
    configured = [type(c).__name__ for c in instantiate_each(cfg.callbacks)]
    # (in Lightning's order: checkpoint callbacks last)
    assert sorted(result.callbacks) == sorted([*configured, "RunSummary"])
    assert {"ModelCheckpoint", "EarlyStopping", "VerboseLog", "TrainingProgressPlot"} <= set(
        configured
    )
    assert {"ValidationReport", "LearningRateMonitor", "TQDMProgressBar"} <= set(configured)
    assert result.loggers == ("CSVLogger",)
    assert result.as_dict()["rounds_ms"] == result.rounds_ms
    assert not (tmp_path / "run").exists()  # written into a temporary folder only


def test_the_lightning_trainer_is_the_configured_one(make_config, tmp_path):
    cfg = make_config("callbacks.progress_bar.refresh_rate=7", "trainer.log_every_n_steps=3")
    clock = RoundClock(warmup=1)
    trainer = overhead.train_trainer(overhead.in_folder(cfg, tmp_path / "t"), CPU, 4, clock)
    bars = [c for c in trainer.callbacks if type(c).__name__ == "TQDMProgressBar"]
    assert len(bars) == 1 and bars[0].refresh_rate == 7
    assert clock in trainer.callbacks
    assert trainer.log_every_n_steps == 3 and trainer.max_steps == 4
    assert trainer.limit_val_batches == 0
    assert trainer.loggers[0].save_dir == str(tmp_path / "t")


def test_overhead_is_the_median_of_the_rounds_differences(make_config, monkeypatch):
    bare = iter([1e-3, 2e-3, 1e-3])
    light = iter([3e-3, 3e-3, 10e-3])
    trainer = SimpleNamespace(callbacks=[RoundClock(0), nn.Identity()], loggers=[nn.Identity()])
    monkeypatch.setattr(overhead, "bare_round", lambda *args: next(bare))
    monkeypatch.setattr(overhead, "lightning_round", lambda *args: (next(light), trainer))
    monkeypatch.setattr(overhead, "profiled_terms", lambda *args: {"loader": 0.5})

    result = measure_overhead(make_config(), CPU, steps=10, rounds=3)

    assert result.rounds_ms == pytest.approx((2.0, 1.0, 9.0))
    assert result.overhead_ms == pytest.approx(2.0)
    assert result.lightning_ms == pytest.approx(3.0) and result.bare_ms == pytest.approx(1.0)
    assert result.spread_ms == pytest.approx(1.0)  # |2-2|, |1-2|, |9-2|
    assert result.callbacks == ("Identity",)  # the clock is ours, not train.py's
    assert result.loggers == ("Identity",)
    assert result.terms_ms == {"loader": 0.5}


def test_the_tiny_module_keeps_the_configs_loss_and_optimizer(make_config):
    module = tiny_module(make_config("loss=ce_dice", "optimizer=adam"))
    assert isinstance(module.network, nn.Conv2d)
    assert module.network.kernel_size == (1, 1)
    assert (module.network.in_channels, module.network.out_channels) == (3, 6)
    assert module.loss_fn.dice > 0 and module.loss_fn.cross_entropy > 0
    assert isinstance(module.optimizer_factory(module.network), torch.optim.Adam)


def test_a_clock_that_timed_nothing_says_so():
    with pytest.raises(ValueError, match="no step was timed"):
        _ = RoundClock(warmup=5).step_s


def test_quiet_restores_the_log_levels():
    logger = logging.getLogger("lightning.pytorch")
    before = logger.level
    with quiet():
        assert logger.level > logging.WARNING
    assert logger.level == before


def test_no_rounds_is_refused(make_config):
    with pytest.raises(ValueError, match="rounds >= 1"):
        measure_overhead(make_config(), CPU, steps=10, rounds=0)


def test_every_file_goes_into_the_given_folder(make_config, tmp_path):
    cfg = make_config("logger=mlflow")
    moved = overhead.in_folder(cfg, tmp_path / "t")
    assert moved.callbacks.model_checkpoint.dirpath == str(tmp_path / "t" / "checkpoints")
    assert moved.logger.csv.save_dir == str(tmp_path / "t")
    # MLflow's store too, not the user's outputs/mlflow.db
    assert moved.logger.mlflow.tracking_uri == f"sqlite:///{tmp_path / 't' / 'mlflow.db'}"
    assert moved.logger.mlflow.artifact_location == str(tmp_path / "t" / "mlartifacts")
    assert cfg.output_dir == str(tmp_path / "run")  # the config itself is left as it was
    assert cfg.logger.mlflow.tracking_uri == "sqlite:///outputs/mlflow.db"


def test_the_terms_split_a_profiled_step_into_the_framework_s_parts():
    # Seconds over 10 steps, named as Lightning's SimpleProfiler names its actions.
    totals = {
        "run_training_batch": 1.0,
        "[_TrainingEpochLoop].train_dataloader_next": 0.1,
        "[Strategy]SingleDeviceStrategy.batch_to_device": 0.02,
        "[LightningModule]SegmentationModule.transfer_batch_to_device": 0.01,  # inside the last
        "[LightningModule]SegmentationModule.optimizer_step": 0.9,
        "[Strategy]SingleDeviceStrategy.training_step": 0.3,
        "[Strategy]SingleDeviceStrategy.backward": 0.4,
        "[LightningModule]SegmentationModule.on_before_optimizer_step": 0.05,
        "[Callback]RunSummary.on_train_batch_end": 0.03,
        "[Callback]RunSummary.on_after_backward": 0.02,  # inside optimizer_step
        "[Callback]ModelCheckpoint{'monitor': 'val/mIoU'}.on_train_batch_end": 0.01,
        "[Callback]ModelCheckpoint{'monitor': 'val/mIoU'}.on_train_end": 5.0,  # not per step
        "[LightningModule]SegmentationModule.optimizer_zero_grad": 0.004,
        "[LightningModule]SegmentationModule.lr_scheduler_step": 0.002,
    }
    terms = overhead.step_terms(totals, steps=10)
    assert terms["loader"] == pytest.approx(10.0) and terms["to device"] == pytest.approx(2.0)
    assert terms["training_step"] == pytest.approx(30.0) and terms["backward"] == pytest.approx(40)
    assert terms["non-finite check, clipping"] == pytest.approx(5.0)
    assert terms["optimizer"] == pytest.approx(90 - 30 - 40 - 5 - 2)  # the rest of optimizer_step
    assert terms["callback RunSummary"] == pytest.approx(5.0)
    assert terms["callback ModelCheckpoint"] == pytest.approx(1.0)
    assert terms["zero_grad"] == pytest.approx(0.4) and terms["schedule"] == pytest.approx(0.2)
    # the whole step: the batch's run and the wait for it; the rest is Lightning's own
    rest = 110 - sum(v for k, v in terms.items() if k != "Lightning's loop, logging")
    assert terms["Lightning's loop, logging"] == pytest.approx(rest)
    assert overhead.step_terms(totals, 10, step_s=0.2)["Lightning's loop, logging"] == (
        pytest.approx(rest + 90)
    )


def test_a_real_round_s_terms_name_every_per_step_callback(make_config, tmp_path):
    cfg = make_config()
    terms = overhead.profiled_terms(
        cfg, tiny_module(cfg), overhead.tiny_batch(cfg), CPU, 2, 6, tmp_path / "p"
    )
    assert all(ms >= 0 for ms in terms.values())
    assert terms["training_step"] > 0 and terms["backward"] > 0 and terms["optimizer"] > 0
    assert {"callback RunSummary", "callback TQDMProgressBar"} <= set(terms)
