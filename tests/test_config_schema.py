import re

import pytest
from omegaconf import OmegaConf

from segscale.config_schema import SCHEMA, check_schema, plain
from segscale.configs import compose_config
from segscale.errors import ConfigError


@pytest.mark.parametrize("name", ["train", "bench", "predict", "evaluate", "export", "data"])
def test_every_primary_configs_defaults_pass_the_schema(name):
    check_schema(compose_config(name))


def test_the_schema_covers_every_key_of_training_and_scaling():
    cfg = compose_config("train")
    for group in ("training", "scaling"):
        keys = {f"{group}.{key}" for key in cfg[group] if not str(key).startswith("_")}
        assert keys <= set(SCHEMA), keys - set(SCHEMA)


def test_a_refusal_names_the_full_key_the_value_and_what_is_allowed():
    with pytest.raises(ConfigError) as refused:
        compose_config("train", ["training.threads=many"])
    assert str(refused.value) == (
        "training.threads='many' is not allowed: expected 'auto' or a positive number of "
        "threads per training process"
    )


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("training.compile=1", "training.compile"),  # a number is not true/false
        ("training.freeze_encoder_epochs=true", "training.freeze_encoder_epochs"),  # nor a count
        ("training.gradient_threshold=nan", "training.gradient_threshold"),
        ("training.ema.decay=1", "training.ema.decay"),
        ("training.ema.start_step=-1", "training.ema.start_step"),
        ("+training.ema.warmup=3", "training.ema"),
        ("training.output_network=best", "training.output_network"),
        # built to slip past: a bool is an int in Python, a quoted number is text
        ("training.threads=true", "training.threads"),
        ("training.threads='2'", "training.threads"),
        ("training.gradient_threshold=true", "training.gradient_threshold"),
        ("scaling.batch=true", "scaling.batch"),
        ("training.output_network=' best-validation'", "training.output_network"),
    ],
)
def test_values_of_the_wrong_kind_or_range_are_refused(override, key):
    with pytest.raises(ConfigError, match="^" + re.escape(f"{key}=")):
        compose_config("train", [override])


def test_keys_absent_unset_or_unresolved_are_left_to_the_other_checks():
    check_schema(OmegaConf.create({"training": {"threads": "???", "compile": "${nowhere}"}}))
    check_schema(OmegaConf.create({"other": 1}))
    with pytest.raises(ConfigError, match=r"training\.compile='yes'"):
        check_schema(OmegaConf.create({"training": {"compile": "${.x}", "x": "yes"}}))


def test_plain_turns_config_nodes_into_python_values():
    node = OmegaConf.create({"a": [1, "${b}"], "b": 2})
    assert plain(node) == {"a": [1, 2], "b": 2}
    assert plain(node.a, resolve=False) == [1, "${b}"]
    assert plain(3) == 3 and plain(None) is None
