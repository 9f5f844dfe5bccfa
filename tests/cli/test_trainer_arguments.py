"""Every ``lightning.Trainer`` argument is overridable as written: ``trainer.<arg>=...``."""

import inspect
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import yaml
from hydra.utils import instantiate

from segscale.configs import CONFIG_DIR
from segscale.training.run.training_run import train
from tests.conftest import compose_config

NOT_IN_THE_CONFIG = {
    "strategy": "the strategy group, built by segscale.training.run.training_run",
    "callbacks": "the callbacks group, plus the run summary",
    "logger": "the logger group",
    "plugins": "segscale's checkpoint I/O",
    "use_distributed_sampler": "false: the datamodule shards each epoch by rank",
    "sync_batchnorm": "training.sync_batchnorm converts the network itself",
}
"""Arguments that ``segscale.training.run.training_run`` passes itself, and what gives them."""

OUR_VALUES = {
    "accelerator",
    "devices",
    "num_nodes",
    "max_epochs",
    "precision",
    "benchmark",
    "log_every_n_steps",
    "check_val_every_n_epoch",
    "val_check_interval",
    "num_sanity_val_steps",
    "deterministic",
    "enable_model_summary",
    "default_root_dir",
}
"""Arguments that conf/trainer/default.yaml sets to values of its own."""

DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(L.Trainer.__init__).parameters.items()
    if name != "self"
}
ARGUMENTS = sorted(set(DEFAULTS) - set(NOT_IN_THE_CONFIG))


def trainer_yaml() -> dict[str, Any]:
    """conf/trainer/default.yaml as written (interpolations unresolved)."""
    return yaml.safe_load((Path(CONFIG_DIR) / "trainer" / "default.yaml").read_text())


def as_override(value: Any) -> str:
    """``value`` as it is written on the command line."""
    return (
        "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )


@pytest.mark.parametrize("name", ARGUMENTS)
def test_every_trainer_argument_is_overridden_without_plus(name):
    cfg = compose_config("train", f"trainer.{name}={as_override(DEFAULTS[name])}")
    assert cfg.trainer[name] == DEFAULTS[name]


def test_the_config_names_every_argument_but_those_run_passes():
    written = set(trainer_yaml()) - {"_target_"}
    assert written == set(ARGUMENTS)
    assert set(NOT_IN_THE_CONFIG) <= set(DEFAULTS)  # a renamed argument shows here
    assert written >= OUR_VALUES


def test_the_other_arguments_hold_lightnings_defaults():
    values = trainer_yaml()
    assert {k: values[k] for k in ARGUMENTS if k not in OUR_VALUES} == {
        k: DEFAULTS[k] for k in ARGUMENTS if k not in OUR_VALUES
    }


def test_the_trainer_builds_from_every_key(tmp_path):
    cfg = compose_config("train", f"output_dir={tmp_path}", "trainer.accelerator=cpu")
    trainer = instantiate(cfg.trainer, strategy="auto", logger=False)
    assert trainer.max_steps == -1 and trainer.max_epochs == cfg.trainer.max_epochs


def test_bench_overrides_set_the_keys_with_double_plus():
    # segscale.bench.measure.ddp_runs starts each ddp run with these: ++ sets a key present or not.
    cfg = compose_config(
        "train",
        "++trainer.max_steps=35",
        "++trainer.max_epochs=-1",
        "++trainer.limit_val_batches=0",
        "++trainer.enable_checkpointing=false",
    )
    assert cfg.trainer.max_steps == 35 and cfg.trainer.max_epochs == -1
    assert cfg.trainer.limit_val_batches == 0 and cfg.trainer.enable_checkpointing is False


def test_max_steps_stops_the_run(make_config):
    summary = train(make_config("trainer.max_steps=2"))  # 2 epochs of 4 steps otherwise
    assert summary["status"] == "finished"
    assert summary["steps"] == 2 and summary["train_patches"] == 2 * 4
