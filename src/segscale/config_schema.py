"""The schema of the config keys segscale owns: each key's kind and allowed values, in one place.

``SCHEMA`` maps the full dotted key (``training.threads``) to a ``Rule``: what the key
admits, in code and in words. ``check_schema`` checks a composed config against it, and
is called where a config is composed (``compose_config``) and where a Hydra app starts
(the ``check_*`` of each entry point): ``training.threads=many`` is refused with
``ConfigError`` (exit 2) naming the key, the value and what is allowed, before anything
is built. A key the config lacks (the ``predict`` config has no ``training``), one left
unset (``???``) and an interpolation that cannot resolve yet are left to the other
checks and to Hydra. Checks the schema cannot say stay with the code that knows them:
rules across keys, files and folders, devices, a network's input side.

Each default is written once, in the config tree (``conf/``), where users read it, Hydra
prints it (``--cfg job``) and a run records it (``.hydra/config.yaml``); code reads the
composed key without a fallback of its own, and ``tests/test_config_schema.py`` checks
that every primary config's defaults pass the schema.

Why not Hydra Structured Configs (dataclasses in the ConfigStore as each group's base):
OmegaConf 2.3 has no union of primitive types, and segscale's keys are such unions
(``training.threads``: ``auto`` or a count; ``training.preemption_signals``: ``auto`` or a
list; ``datamodule.num_workers``: ``auto`` or a count; ``training.ema``: null or a
mapping); an Enum field hands an Enum member, not the string, to every reader (and to
the ``_target_`` it configures); its ``ValidationError`` names neither what is allowed
nor exits 2; and a dataclass base would write each default a second time beside the
YAML option that users read. A table of rules checked on the composed config keeps the
YAML as it is and says everything a structured config would, in segscale's own messages.

``plain`` turns a config node into plain Python values: the one place that does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from segscale.errors import ConfigError

_ABSENT = object()

NONFINITE_POLICIES = ("stop", "skip")
"""``training.on_nonfinite``: stop the run (exit 3) or skip the step."""
CLIP_METHODS = ("l2norm", "global-l2norm", "absolute-value")
"""``training.gradient_threshold_method``: MATLAB's ``GradientThresholdMethod`` values."""
OUTPUT_NETWORKS = ("best-validation", "last-iteration")
"""``training.output_network``: the network a run hands over (best.ckpt or last.ckpt)."""
BATCH_MODES = ("per_device", "global")
"""``scaling.batch``: ``datamodule.batch_size`` on each device, or split across them."""
LR_RULES = ("none", "linear", "sqrt")
"""``scaling.lr``: how ``optimizer.lr`` follows the global batch."""
SCHEDULES = ("none", "piecewise", "poly", "cosine")
"""``scheduler.name``: MATLAB's ``LearnRateSchedule`` values, and DeepLab's poly and cosine."""
WEIGHT_METHODS = ("inverse", "median")
"""``loss.class_weights`` computed from the training set's class frequencies."""

TARGETS = {
    "scaling": "segscale.runs.scaling.rules.ScalingRules",
    "loss": "segscale.models.losses.SegmentationLoss",
    "scheduler": "segscale.models.optim.Schedule",
}
"""Groups checked only while they build segscale's own object (a user's ``_target_``
takes keys of its own)."""


@dataclass(frozen=True)
class Rule:
    """What one key admits.

    ``ok(value)`` is true for an allowed plain value; ``expected`` says it in words.
    """

    ok: Callable[[Any], bool]
    expected: str
    names: Callable[[], list[str]] | None = None
    """The allowed names, looked up when checked (``names_in``); ``expected`` then unused."""

    def said(self) -> str:
        """What the key admits, in words."""
        return f"one of {self.names()}" if self.names else self.expected


def plain(value: Any, resolve: bool = True) -> Any:
    """``value`` as plain Python values (dicts, lists); anything not a config node as it is."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=resolve)
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def boolean() -> Rule:
    """``true`` or ``false``."""
    return Rule(lambda v: isinstance(v, bool), "true or false")


def one_of(*values: Any, words: str | None = None) -> Rule:
    """Exactly one of ``values`` (``True`` is not ``1``)."""
    shown = words or f"one of {list(values)}"
    return Rule(lambda v: any(type(v) is type(o) and v == o for o in values), shown)


def integer(minimum: int, words: str = "") -> Rule:
    """An integer ``>= minimum`` (a bool is not one)."""
    return Rule(lambda v: _integer(v) and v >= minimum, words or f"an integer >= {minimum}")


def number(
    above: float | None = None,
    at_least: float | None = None,
    below: float | None = None,
    at_most: float | None = None,
    finite: bool = True,
    words: str = "",
) -> Rule:
    """A number (int or float, not a bool) within the bounds given."""

    def ok(v: Any) -> bool:
        return (
            _number(v)
            and not math.isnan(v)
            and (not finite or math.isfinite(v))
            and (above is None or v > above)
            and (at_least is None or v >= at_least)
            and (below is None or v < below)
            and (at_most is None or v <= at_most)
        )

    return Rule(ok, words or "a number")


def either(*rules: Rule, words: str = "") -> Rule:
    """A value any of ``rules`` admits."""
    shown = words or " or ".join(rule.said() for rule in rules)
    return Rule(lambda v: any(rule.ok(v) for rule in rules), shown)


def null() -> Rule:
    """``null``."""
    return Rule(lambda v: v is None, "null")


def _name_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(item, str) for item in v)


def names_in(path: str, *extra: str) -> Rule:
    """A name of the mapping at the dotted ``path`` (or one of ``extra``), imported when checked.

    The names stay with the code that implements them (``FORMATS``: a name → its exporter):
    this module sits below it, so it refers to them by path rather than importing them.
    """

    def names() -> list[str]:
        return [*extra, *get_object(path)]

    return Rule(lambda v: isinstance(v, str) and v in names(), "", names)


def _term_weight() -> Rule:
    return number(at_least=0, words="a finite term weight >= 0 (0: off)")


def _class_weights(v: Any) -> bool:
    return isinstance(v, list) and all(_number(w) and math.isfinite(w) and w >= 0 for w in v)


def _weights(v: Any) -> bool:
    return (
        isinstance(v, list)
        and bool(v)
        and all(_number(w) for w in v)
        and min(v) >= 0
        and max(v) > 0
    )


SCHEMA: Mapping[str, Rule] = {
    # How the network is trained (conf/train.yaml, training:).
    "training.output_network": one_of(*OUTPUT_NETWORKS, words="last-iteration or best-validation"),
    "training.gradient_threshold": number(
        above=0, finite=False, words="a positive number, or .inf for no clipping"
    ),
    "training.gradient_threshold_method": one_of(*CLIP_METHODS),
    "training.sync_batchnorm": boolean(),
    "training.channels_last": boolean(),
    "training.compile": boolean(),
    "training.keep_freed_memory": boolean(),
    "training.on_nonfinite": one_of(
        *NONFINITE_POLICIES,
        words="stop (end the run with an error) or skip (skip the step and go on)",
    ),
    "training.ema": either(
        null(),
        Rule(
            lambda v: isinstance(v, dict) and not set(v) - {"decay", "start_step"},
            "the keys decay and start_step",
        ),
        words="null or the keys decay (0 < decay < 1) and start_step, "
        "e.g. training.ema.decay=0.999",
    ),
    "training.ema.decay": either(
        null(),
        number(above=0, below=1),
        words="a number between 0 and 1 (exclusive), such as 0.999 (the average's weight "
        "at each step), or null (no averaging)",
    ),
    "training.ema.start_step": integer(
        0, "an integer >= 0, the optimizer step the average starts from"
    ),
    "training.threads": either(
        one_of("auto"),
        integer(1),
        words="'auto' or a positive number of threads per training process",
    ),
    "training.encoder_lr_factor": number(
        at_least=0,
        words="a number >= 0 (the encoder's learning rate over the decoder's; 0: not updated)",
    ),
    "training.freeze_encoder_epochs": integer(0, "a whole number of epochs >= 0"),
    "training.preemption_signals": either(
        one_of("auto"),
        Rule(_name_list, "a list of signal names"),
        words="auto (this platform's signals) or a list of signal names",
    ),
    "training.preemption_deadline_s": number(
        above=0,
        words="seconds > 0 (the time a rank has from the start of its stop to its exit)",
    ),
    # How the batch and the learning rate follow the number of devices (conf/scaling/).
    "scaling.batch": one_of(*BATCH_MODES),
    "scaling.lr": one_of(*LR_RULES),
    "scaling.base_batch_size": integer(
        1, "the global batch size optimizer.lr was chosen for (an integer >= 1)"
    ),
    "scaling.warmup_epochs": either(null(), number(at_least=0), words="null or a number >= 0"),
    "scaling.worker_load": either(
        null(),
        Rule(_weights, ""),
        words="null or one non-negative weight per device, at least one of them positive, "
        "e.g. [1, 1, 0.5]",
    ),
    # The data a run trains on (conf/datamodule/): the keys every datamodule option has.
    # (num_classes is not here: auto and checkpoint are filled in after composition.)
    "datamodule.patch_size": integer(1),
    "datamodule.patches_per_image": integer(1),
    "datamodule.batch_size": integer(1),
    "datamodule.shuffle": names_in("segscale.data.sampling.loaders.SHUFFLE_MODES"),
    "datamodule.num_workers": either(
        one_of("auto"),
        integer(0),
        words="an integer >= 0, or 'auto' (the rank's share of the CPU cores)",
    ),
    "datamodule.prefetch_factor": integer(1),
    "datamodule.persistent_workers": boolean(),
    "datamodule.pin_memory": either(boolean(), null(), words="true, false or null"),
    # The optimizer and its schedule (conf/optimizer/, conf/scheduler/).
    "optimizer.lr": number(above=0, words="a positive learning rate such as 0.01"),  # any target
    "scheduler.name": one_of(*SCHEDULES),
    "scheduler.drop_period": integer(1, "a whole number of epochs >= 1"),
    "scheduler.drop_factor": number(above=0, at_most=1, words="a value in (0, 1]"),
    "scheduler.power": number(),
    "scheduler.min_factor": number(at_least=0, at_most=1, words="a number in [0, 1]"),
    "scheduler.warmup_epochs": number(at_least=0, words="a number of epochs >= 0"),
    "scheduler.warmup_steps": integer(0, "a number of optimizer steps >= 0"),
    "scheduler.warmup_start_factor": number(
        at_least=0, at_most=1, words="a number in [0, 1]: the warmup's first share of the rate"
    ),
    # The loss of segscale.models.losses.SegmentationLoss (conf/loss/).
    "loss.cross_entropy": _term_weight(),
    "loss.dice": _term_weight(),
    "loss.focal": _term_weight(),
    "loss.lovasz": _term_weight(),
    "loss.focal_gamma": number(at_least=0, words="a finite number >= 0"),
    "loss.label_smoothing": number(
        at_least=0,
        below=1,
        words="a number in [0, 1) (0: off; the share of the target spread over all classes)",
    ),
    "loss.ohem_thresh": either(
        null(),
        number(above=0, below=1),
        words="a probability in (0, 1), or null (off); pixels whose true class is "
        "predicted below it count as hard",
    ),
    "loss.ohem_min_kept": integer(0, "an integer >= 0 (the fewest hardest pixels kept per batch)"),
    "loss.class_weights": either(
        null(),
        one_of(*WEIGHT_METHODS),
        Rule(_class_weights, ""),
        words=f"null, one of {list(WEIGHT_METHODS)} or a list of finite per-class weights >= 0",
    ),
}
"""Every key segscale owns that the schema checks, by its full dotted key."""


TASK_SCHEMA: Mapping[str, Mapping[str, Rule]] = {
    "export": {
        "format": names_in("segscale.inference.export.formats.FORMATS"),
        "dtype": names_in("segscale.inference.export.formats.DTYPES", "auto"),
        "returns": names_in("segscale.inference.export.formats.RETURNS"),
        "verify": boolean(),
    },
    "predict": {"check_value_range": boolean(), "skip_unreadable": boolean()},
    "evaluate": {"check_value_range": boolean(), "other_data": boolean()},
}
"""The top-level keys of one primary config (its ``task_name``), by that name."""


def check_schema(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for the first key of ``cfg`` whose value ``SCHEMA`` refuses.

    The message names the full key, the value and what is allowed:
    ``training.threads='many' is not allowed: expected 'auto' or a positive number ...``.
    """
    task = OmegaConf.select(cfg, "task_name", default=None)
    rules = {**SCHEMA, **TASK_SCHEMA.get(task, {})} if isinstance(task, str) else SCHEMA
    for key, rule in rules.items():
        group = key.partition(".")[0]
        if group in TARGETS and OmegaConf.select(cfg, f"{group}._target_") != TARGETS[group]:
            continue
        value = _value(cfg, key)
        if value is not _ABSENT and not rule.ok(value):
            raise ConfigError(f"{key}={value!r} is not allowed: expected {rule.said()}")


def _value(cfg: DictConfig, key: str) -> Any:
    """``cfg``'s plain value at ``key``; ``_ABSENT`` when it has none, is unset or unresolved."""
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    try:
        if not isinstance(node, DictConfig) or name not in node or OmegaConf.is_missing(node, name):
            return _ABSENT
        return plain(node[name])
    except (InterpolationResolutionError, MissingMandatoryValue, ValueError):
        return _ABSENT
