"""An Optuna search's space, from Hydra's sweep syntax; a trial's parameters as overrides.

``choice(a, b)`` is a category, ``range(lo, hi[, step])`` integers (``hi`` excluded as in
Python), ``interval(lo, hi)`` a float (an integer when both ends are), and
``tag(log, interval(lo, hi))`` is sampled on a log scale. Every override that is not a
sweep is passed to each trial's job as given.
"""

from typing import Any

from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    RangeSweep,
)
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from segscale.command_line import quoted_override
from segscale.errors import ConfigError


def search_space(
    config_loader: ConfigLoader, params: dict[str, str], arguments: list[str]
) -> tuple[dict[str, BaseDistribution], list[str]]:
    """The distributions that ``params`` and ``arguments`` sweep, and the other overrides.

    ``params`` is ``hydra.sweeper.params`` (key → sweep), ``arguments`` the command line's
    overrides; a ``ConfigError`` when nothing is swept.
    """
    parser = OverridesParser.create(config_loader=config_loader)
    configured = [f"{key}={value}" for key, value in params.items()]
    space: dict[str, BaseDistribution] = {}
    fixed: list[str] = []
    for override in parser.parse_overrides([*configured, *arguments]):
        if override.is_sweep_override():
            space[override.get_key_element()] = distribution(override)
        else:
            assert override.input_line is not None  # parse_overrides sets it
            fixed.append(override.input_line)
    if not space:
        raise ConfigError(
            "hparams_search: the search space is empty; expected hydra.sweeper.params "
            "(conf/hparams_search/optuna.yaml) or a swept override such as "
            "'optimizer.lr=tag(log, interval(0.001, 0.1))'"
        )
    return space, fixed


def distribution(override: Override) -> BaseDistribution:
    """The Optuna distribution that a Hydra sweep override describes."""
    sweep = override.value()
    key = override.get_key_element()
    log_scale = "log" in getattr(sweep, "tags", set())
    if isinstance(sweep, ChoiceSweep):
        return CategoricalDistribution([_plain(v) for v in sweep.list])
    if isinstance(sweep, RangeSweep):
        if sweep.start is None or sweep.stop is None:  # what int(None) would raise
            raise TypeError(f"hydra.sweeper.params.{key}: range without a start or a stop")
        values = list(range(int(sweep.start), int(sweep.stop), int(sweep.step or 1)))
        if not values:
            raise ConfigError(
                f"hydra.sweeper.params.{key}: range({sweep.start}, {sweep.stop}) is empty"
            )
        return IntDistribution(values[0], values[-1], step=int(sweep.step or 1))
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        if low is None or high is None:  # what float(None) would raise
            raise TypeError(f"hydra.sweeper.params.{key}: interval without a start or an end")
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log_scale)
        return FloatDistribution(float(low), float(high), log=log_scale)
    raise ConfigError(
        f"hydra.sweeper.params.{key}={override.get_value_element_as_str()!r} is not a search "
        "space: expected choice(...), range(...), interval(...) or tag(log, interval(...))"
    )


def _plain(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def first_point(space: dict[str, BaseDistribution]) -> list[str]:
    """One point of ``space`` as overrides: each key's first choice or lowest value."""
    return [f"{key}={_first(dist)}" for key, dist in space.items()]


def parameter_overrides(params: dict[str, Any]) -> list[str]:
    """A trial's sampled parameters as Hydra overrides."""
    return [f"{k}={_override_value(v)}" for k, v in params.items()]


def _first(dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return _override_value(dist.choices[0])
    # ``distribution`` makes only these three kinds.
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    return dist.low


def _override_value(value: Any) -> str:
    """A sampled value as a Hydra override value (strings quoted when they need it)."""
    if isinstance(value, str) and not value.replace("_", "").replace("-", "").isalnum():
        return quoted_override(value)
    return str(value)
