from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest
from omegaconf import OmegaConf

from segscale.config_types import admits, check_types, expected
from segscale.configs import CONFIG_DIR
from segscale.errors import ConfigError
from segscale.models.checkpoint.recorded_classes import CLASS_KEYS
from segscale.training.run.config_checks import check_config
from tests.conftest import compose_config

if TYPE_CHECKING:
    from segscale.no_such_module import Unknowable

HERE = "tests.test_config_types"


def every_kind(
    count: int | None = None,
    ratio: float = 1.0,
    flag: bool = False,
    name: str = "x",
    mode: Literal["a", "b"] = "a",
    sizes: Sequence[int] = (),
    table: Mapping[str, str | None] | None = None,
    anything: Any = None,
    function: Callable | None = None,
    path: Path | None = None,
    **extra: Any,
) -> None:
    """A target whose parameters have one annotation of each sort."""


def unknowable(value: Unknowable) -> None:
    """A target whose annotations cannot be evaluated (a name only a type checker sees)."""


def _node(**values: Any):
    return OmegaConf.create({"_target_": f"{HERE}.every_kind", **values})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"count": "abc"}, "node.count='abc' is not allowed: expected a number or null"),
        ({"count": True}, "expected a number or null"),  # a bool is not a number
        ({"ratio": None}, "node.ratio=None is not allowed: expected a number"),
        ({"flag": 1}, "node.flag=1 is not allowed: expected true or false"),
        ({"name": 3}, "expected a string"),
        ({"mode": "c"}, "node.mode='c' is not allowed: expected one of ['a', 'b']"),
        ({"sizes": 3}, "expected a list of numbers"),
        ({"sizes": [1, "x"]}, "node.sizes=[1, 'x'] is not allowed: expected a list of numbers"),
        ({"table": [1]}, "expected a mapping or null"),
        ({"table": {"a": 1}}, "node.table={'a': 1} is not allowed: expected a mapping or null"),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused(values, message):
    with pytest.raises(ConfigError) as error:
        check_types(OmegaConf.create({"node": _node(**values)}))
    assert message in str(error.value)


@pytest.mark.parametrize(
    "values",
    [
        {"count": float("inf")},  # an int parameter takes .inf: kinds, not exact types
        {"count": 3, "ratio": 2},
        {"mode": "b", "sizes": [1, 2.5], "table": {"a": "x", "b": None}},
        {"anything": [1, {"a": 2}], "function": "print", "path": 3},  # not checked
        {"extra": "anything", "_convert_": "all", "_partial_": True},  # **kwargs, _keys_
        {"count": "???", "ratio": "${no.such.key}", "name": "${oc.env:SEGSCALE_NO_SUCH_VAR}"},
        {"sizes": [1, "${no.such.key}"]},  # an item that does not resolve yet
        {"path": {"_target_": "pathlib.Path", "_args_": ["x"]}},  # builds an object
        {"count": {"_target_": "builtins.int", "_args_": ["3"]}},
    ],
)
def test_values_of_an_admitted_kind_pass(values):
    check_types(OmegaConf.create({"node": _node(**values)}))


def test_nested_targets_and_list_items_are_checked():
    cfg = OmegaConf.create(
        {"outer": {"_target_": f"{HERE}.every_kind", "items": [_node(count="abc")]}}
    )
    with pytest.raises(ConfigError, match=r"outer\.items\[0\]\.count='abc'"):
        check_types(cfg)


def test_targets_that_cannot_be_resolved_or_evaluated_are_left_to_hydra():
    check_types(OmegaConf.create({"a": {"_target_": "no.such.module.f", "x": "abc"}}))
    check_types(OmegaConf.create({"a": {"_target_": f"{HERE}.unknowable", "value": "abc"}}))


def test_filled_in_keys_are_skipped():
    cfg = OmegaConf.create({"node": _node(ratio=None)})
    check_types(cfg, filled_in=("node.ratio",))


def test_interpolated_values_are_checked_once_resolved():
    cfg = OmegaConf.create({"n": "abc", "node": _node(count="${n}")})
    with pytest.raises(ConfigError, match=r"node\.count='abc'"):
        check_types(cfg)


@pytest.mark.parametrize(
    ("annotation", "phrase"),
    [
        (int | None, "a number or null"),
        (bool | Literal["warn"] | None, "true, false, 'warn' or null"),
        (Literal[16] | Literal["16-mixed"] | None, "one of [16, '16-mixed'] or null"),
        (list[int] | str, "a list of numbers or a string"),
        (tuple[float, str], "a list of numbers or strings"),
    ],
)
def test_expected_says_what_is_allowed_in_plain_words(annotation, phrase):
    assert expected(annotation) == phrase


def test_literals_match_values_of_their_own_kind_only():
    assert admits(Literal[16], 16) and not admits(Literal[16], "16")
    assert not admits(Literal[1], True) and admits(Literal[True], True)


def test_kwargs_are_checked_against_the_callable_that_receives_them(make_config):
    # build_optimizer passes momentum on to torch.optim.SGD (momentum: float) ...
    with pytest.raises(ConfigError, match=r"optimizer\.momentum='abc'.*expected a number"):
        check_config(make_config("optimizer.momentum=abc"))
    # ... and build_network passes decoder_channels on to smp.DeepLabV3Plus (int).
    with pytest.raises(ConfigError, match=r"model\.decoder_channels=\[1, 2\].*a number"):
        check_config(make_config("model.decoder_channels=[1,2]"))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.max_epochs=abc", "trainer.max_epochs='abc' is not allowed: expected a number"),
        ("trainer.precision=33", "trainer.precision=33 is not allowed: expected one of [64, 32"),
        ("trainer.benchmark=fast", "trainer.benchmark='fast' is not allowed: expected true"),
        ("datamodule.mean=[0.5,x,0.5]", "datamodule.mean=[0.5, 'x', 0.5] is not allowed"),
        ("datamodule.augmentation.rotation=20", "datamodule.augmentation.rotation=20 is not"),
        ("datamodule.source.num_train=many", "datamodule.source.num_train='many' is not"),
        ("loss.dice=yes", "loss.dice='yes' is not allowed: expected a finite term weight >= 0"),
        ("scheduler.power=abc", "scheduler.power='abc' is not allowed: expected a number"),
        ("scaling.worker_load=[1,a]", "scaling.worker_load=[1, 'a'] is not allowed"),
        ("callbacks.early_stopping.patience=abc", "callbacks.early_stopping.patience='abc'"),
        ("callbacks.learning_rate_monitor.logging_interval=hour", "one of ['step', 'epoch']"),
        ("+logger.csv.flush_logs_every_n_steps=often", "logger.csv.flush_logs_every_n_steps="),
    ],
)
def test_check_config_refuses_wrong_kinds_across_groups(make_config, override, message):
    with pytest.raises(ConfigError) as error:
        check_config(make_config(override))
    assert message in str(error.value)


def test_precision_lists_the_allowed_values(make_config):
    with pytest.raises(ConfigError) as error:
        check_config(make_config("trainer.precision=33"))
    for allowed in ("'32-true'", "'bf16-mixed'", "'16-mixed'", "null"):
        assert allowed in str(error.value)


GROUPS = ("model", "loss", "optimizer", "scheduler", "logger", "callbacks", "strategy")
OPTIONS = [
    (name, group, path.stem)
    for name in ("train", "bench")
    for group in (*GROUPS, "datamodule", "experiment")
    for path in sorted((Path(CONFIG_DIR) / group).glob("*.yaml"))
]


@pytest.mark.parametrize(
    ("name", "group", "option"), OPTIONS, ids=[f"{n}:{g}={o}" for n, g, o in OPTIONS]
)
def test_every_shipped_config_passes(name, group, option):
    root = ["datamodule.source.root=/data"] if option == "folder" else []
    # A run always has its folder; outside one, ${hydra:runtime.output_dir} is whatever
    # an earlier test left in Hydra's global config (None after a plugin test).
    check_config(compose_config(name, f"{group}={option}", "output_dir=/runs/run", *root))


@pytest.mark.parametrize(
    "overrides", [("predict",), ("evaluate",), ("evaluate", "datamodule=folder")]
)
def test_inference_configs_pass(overrides):
    # evaluate's class keys and its validation tile size say "checkpoint" until
    # evaluate.py fills them in from ckpt
    cfg = compose_config(*overrides)
    filled_in = [f"datamodule.{key}" for key in CLASS_KEYS]
    if cfg.inference.get("tile_size") == "checkpoint":
        filled_in.append("inference.tile_size")
    check_types(cfg, filled_in)


def test_inference_configs_refuse_wrong_kinds():
    with pytest.raises(ConfigError, match=r"inference\.tile_size='big'"):
        check_types(compose_config("predict", "inference.tile_size=big"))
