"""The Configuration page (docs/configuration.md) tells the truth about the config tree.

Its group table must list every config group under conf/ and every option of each
(an option Hydra itself provides, such as ``hydra/launcher=basic``, may be listed too),
each listed option must compose, and the option marked "(default)" must be the one a
plain run gets. Its key tables (a ``key`` and a ``default`` column) state defaults,
either one for the key, or one per option of the group that sets the key, written
`128` (`synthetic`), `256` (`folder`); each must be the composed value. A row that is
not one key with backticked values (prose, several keys) states nothing checked.
Composing only: nothing is instantiated or trained.

Each check returns the problems it finds in a text, so the tests below can also show
that an edited copy of the page (an option dropped, a default changed) is caught.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from segscale.configs import CONFIG_DIR, compose_config

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
PRIMARY_CONFIGS = ("train", "predict", "evaluate")
"""The configs a group may belong to, in the order a group is looked for in them."""

CELL_SPLIT = re.compile(r"\|(?=(?:[^`]*`[^`]*`)*[^`]*$)")
"""A table row's separators: the pipes outside backticks."""
CODE = re.compile(r"`([^`]+)`")
DEFAULT_MARK = re.compile(r"`([^`]+)`\s*\(default\b")
PER_OPTION = re.compile(r"`([^`]+)`\s*\(([^()]*)\)")
"""``value`` (``option``, ``option``): a default stated for some options of a group."""


def configuration_section(text: str) -> str:
    """The Configuration page from its title on (the whole page: MATLAB's table has its own)."""
    return text[text.index("# Configuration\n") :]


def tables(section: str) -> list[list[dict[str, str]]]:
    """Every Markdown table of ``section``: its rows, each as {header: cell}."""
    found: list[list[dict[str, str]]] = []
    lines = [line.strip() for line in section.splitlines()]
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = cells(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(header, cells(lines[i]), strict=True)))
                i += 1
            found.append(rows)
        else:
            i += 1
    return found


def cells(line: str) -> list[str]:
    """The cells of a table row, stripped."""
    return [cell.strip() for cell in CELL_SPLIT.split(line.strip().strip("|"))]


def listed_groups(section: str) -> dict[str, list[str]]:
    """``{group: [option, ...]}`` from the table with a ``group`` and an ``options`` column."""
    (table,) = [t for t in tables(section) if t and {"group", "options"} <= set(t[0])]
    return {CODE.findall(row["group"])[0]: CODE.findall(row["options"]) for row in table}


def marked_default(section: str, group: str) -> str | None:
    """The option the group table marks "(default)"; else ``default`` if listed; else none."""
    (table,) = [t for t in tables(section) if t and {"group", "options"} <= set(t[0])]
    (row,) = [r for r in table if CODE.findall(r["group"])[0] == group]
    marked = DEFAULT_MARK.findall(row["options"])
    if marked:
        return marked[0]
    return "default" if "default" in CODE.findall(row["options"]) else None


def stated_defaults(section: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(key, value, options)`` for each default the key tables state.

    ``options`` is empty for a default of the whole config. A row whose key cell is not
    one key, or whose default cell is prose, states nothing checkable and is left out.
    """
    stated = []
    for table in tables(section):
        for row in table:
            key = re.fullmatch(r"`([\w.]+)`", row.get("key", ""))
            if not key or "default" not in row:
                continue
            pairs = PER_OPTION.findall(row["default"])
            if pairs:
                for value, annotation in pairs:
                    stated.append((key[1], value, tuple(CODE.findall(annotation))))
            elif single := re.fullmatch(r"`([^`]+)`", row["default"]):
                stated.append((key[1], single[1], ()))
    return stated


@functools.cache
def composed(config: str, override: str | None = None) -> DictConfig:
    """``conf/<config>.yaml`` with at most one ``group=option`` override, composed once."""
    return compose_config(config, [override] if override else [], return_hydra_config=True)


@functools.cache
def available(group: str) -> frozenset[str]:
    """Every option Hydra can compose for ``group``: conf/'s, Hydra's and its plugins'."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return frozenset(GlobalHydra.instance().config_loader().get_group_options(group))


def conf_groups() -> dict[str, set[str]]:
    """The groups under conf/ (a folder of .yaml files) and the options of each."""
    groups: dict[str, set[str]] = {}
    for path in Path(CONFIG_DIR).rglob("*.yaml"):
        if path.parent != Path(CONFIG_DIR):
            groups.setdefault(path.parent.relative_to(CONFIG_DIR).as_posix(), set()).add(path.stem)
    return groups


def primary_config(group: str) -> str:
    """The first of ``PRIMARY_CONFIGS`` whose defaults choose an option of ``group``."""
    for config in PRIMARY_CONFIGS:
        if group in composed(config).hydra.runtime.choices:
            return config
    raise AssertionError(f"no config of {PRIMARY_CONFIGS} has the group {group}")


def try_compose(config: str, group: str, option: str) -> tuple[DictConfig | None, str]:
    """``config`` with ``group=option``, or None and why it does not compose.

    The option a plain config already has is not composed again.
    """
    if composed(config).hydra.runtime.choices[group] == option:
        return composed(config), ""
    try:
        return composed(config, f"{group}={option}"), ""
    except (HydraException, OmegaConfBaseException) as error:
        return None, f"{type(error).__name__}: {error}"


def group_problems(section: str) -> list[str]:
    """What the group table gets wrong: groups, options, defaults, options that fail."""
    listed = listed_groups(section)
    ours = conf_groups()
    problems = [f"group {g} is not in the table" for g in sorted(set(ours) - set(listed))]
    for group, options in listed.items():
        if not available(group):
            problems.append(f"group {group} does not exist")
            continue
        missing = ours.get(group, set()) - set(options)
        unknown = set(options) - available(group)
        problems += [f"{group}: option {o} is not in the table" for o in sorted(missing)]
        problems += [f"{group}: option {o} does not exist" for o in sorted(unknown)]
        config = primary_config(group)
        for option in [o for o in options if o not in unknown]:
            cfg, error = try_compose(config, group, option)
            if cfg is None:
                problems.append(f"{group}={option} does not compose: {error}")
            elif cfg.hydra.runtime.choices[group] != option:
                problems.append(f"{group}={option} composes {cfg.hydra.runtime.choices[group]}")
        default = composed(config).hydra.runtime.choices[group]
        if default != marked_default(section, group):
            problems.append(
                f"{group}: the table's default is {marked_default(section, group)}, "
                f"a plain {config} config has {default}"
            )
    return problems


def default_problems(section: str) -> list[str]:
    """Each stated default that is not the composed value, or names no single option."""
    groups = listed_groups(section)
    problems = []
    for key, literal, options in stated_defaults(section):
        if not options:
            problems += value_problems(composed("train"), key, literal, "")
        for option in options:
            owners = [g for g, listed in groups.items() if option in listed and owns(g, key)]
            if len(owners) != 1:
                problems.append(f"{key}: `{option}` is an option of {owners or 'no group'}")
                continue
            cfg, error = try_compose("train", owners[0], option)
            override = f"{owners[0]}={option}"
            if cfg is None:
                problems.append(f"{key}: {override} does not compose: {error}")
            else:
                problems += value_problems(cfg, key, literal, f" with {override}")
    return problems


def owns(group: str, key: str) -> bool:
    """Whether ``group`` may set ``key``: ``datamodule/classes`` sets ``datamodule.*``."""
    return group.split("/")[0] == key.split(".")[0]


def value_problems(cfg: DictConfig, key: str, literal: str, where: str) -> list[str]:
    """``[]`` if ``cfg``'s ``key`` is the page's ``literal`` (a YAML value), else why not."""
    value = plain(OmegaConf.select(cfg, key, default=KeyError))
    if value is KeyError:
        return [f"{key}: the page says {literal}{where}, the config has no such key"]
    if value != yaml.safe_load(literal):
        return [f"{key}: the page says {literal}{where}, the config {value!r}"]
    return []


def training_key_problems(section: str) -> list[str]:
    """The ``training.*`` keys of conf/train.yaml that the section's paragraph leaves out."""
    paragraph = section[section.index("`training.*`") :].split("\n\n")[0]
    named = set(CODE.findall(paragraph))
    keys = set(composed("train").training)
    return [f"training.{k} is not in the training.* paragraph" for k in sorted(keys - named)]


def plain(value: Any) -> Any:
    """A config value as plain Python (lists and dicts unwrapped)."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


@pytest.fixture(scope="module")
def section() -> str:
    return configuration_section(PAGE.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_the_table_lists_every_group_and_option_and_each_composes(section):
    assert len(listed_groups(section)) >= 17  # the table was found and parsed
    assert group_problems(section) == []


def test_every_default_the_key_tables_state_is_the_composed_one(section):
    stated = stated_defaults(section)
    assert ("datamodule.patch_size", "256", ("folder",)) in stated  # parsed per option
    assert ("datamodule.batch_size", "8", ()) in stated
    assert default_problems(section) == []


def test_the_training_paragraph_names_every_training_key(section):
    assert training_key_problems(section) == []


EDITS = {
    "an option left out": (
        "`synthetic` (default), `folder`",
        "`synthetic` (default)",
        "datamodule: option folder is not in the table",
    ),
    "an option that does not exist": (
        "`fpn`, `segformer`, `upernet`",
        "`fpn`, `segformer`, `upernet`, `hrnet`",
        "model: option hrnet does not exist",
    ),
    "a group left out": (
        "| `hydra/sweeper` |",
        "| `not_a_group` |",
        "group hydra/sweeper is not in the table",
    ),
    "the wrong default option": (
        "`poly` (default), `none`",
        "`poly`, `none` (default)",
        "scheduler: the table's default is none",
    ),
    "a wrong per-option default": (
        "`256` (`folder`)",
        "`512` (`folder`)",
        "datamodule.patch_size: the page says 512 with datamodule=folder, the config 256",
    ),
    "a wrong default": (
        "| `datamodule.batch_size` | `8` |",
        "| `datamodule.batch_size` | `16` |",
        "datamodule.batch_size: the page says 16, the config 8",
    ),
    "a training key left out": ("`threads` (see", "(see", "training.threads is not in"),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_untrue_table_is_caught(section, edit):
    old, new, problem = EDITS[edit]
    assert old in section
    edited = section.replace(old, new, 1)
    checks = [group_problems, default_problems, training_key_problems]
    problems = [p for check in checks for p in check(edited)]
    assert any(p.startswith(problem) for p in problems), problems
