"""A run folder's recorded overrides, read as data: what a resume may restore from them.

A resume (``ckpt_path=last`` or a path) puts the overrides of the run's latest launch
record back in front of the command line's (``relaunch.restore_overrides``). The record
is a file in a run folder, which anyone who can write there (a shared folder, a copied
run) can edit, and Hydra instantiates whatever ``_target_`` a config names. So a record
is trusted for values only: ``read_recorded_overrides`` refuses, naming the file and the
line, any override that would be restored and

- names one of Hydra's instantiation keys (``_target_``, ``_args_``, ``_partial_``,
  ``_recursive_``, ``_convert_``) in its key or anywhere in its value, or builds config
  from text (``oc.create``, ``oc.decode``), which could spell one;
- sets Hydra's own settings (``hydra.*``, ``hydra/...``): Hydra records those apart
  (``hydra.yaml``), never in ``overrides.yaml``, and they reach the environment of the
  processes a run starts (``hydra.job.env_set``) and where configs are found
  (``hydra.searchpath``);
- picks a config group option that is not a file of the group (``model=../../x``).

An override the command line gives again (the same key) or deletes (``~key`` or a key
above it) is not restored, so is not refused: a run started with a callback of one's own
(``+callbacks.x._target_=...``) resumes when the command line gives it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException

from segscale.configs import CONFIG_DIR
from segscale.errors import ConfigError

INSTANTIATION_KEYS = ("_target_", "_args_", "_partial_", "_recursive_", "_convert_")
"""Keys that make Hydra's ``instantiate`` call code, or change what it calls."""
TEXT_TO_CONFIG = ("oc.create", "oc.decode")
"""Resolvers that turn a string into config (which could hold an instantiation key)."""


@dataclass(frozen=True)
class RecordedOverride:
    """One override of a launch record, with the line of the file it is on."""

    text: str
    line: int


def read_recorded_overrides(
    path: Path, given: list[str], config_dirs: tuple[Path, ...] = ()
) -> list[str]:
    """The overrides recorded in ``path`` (an ``overrides.yaml``), each checked as data.

    ``given`` are the command line's overrides: a recorded override they replace or
    delete is not checked (it is not restored). ``config_dirs`` are config folders of
    the user's besides the package's (``--config-dir``), whose group options count.
    Raises ``ConfigError`` naming the file and line of the first refused override.
    """
    recorded = _read_lines(path)
    parser = OverridesParser.create()
    given_parsed = parser.parse_overrides(given)
    replaced = {o.key_or_group for o in given_parsed if not o.is_delete()}
    deleted = tuple(o.key_or_group for o in given_parsed if o.is_delete())
    for entry in recorded:
        try:
            (override,) = parser.parse_overrides([entry.text])
        except HydraException as error:
            raise ConfigError(
                f"{path}:{entry.line}: {entry.text!r} is not an override Hydra reads "
                f"({error}); expected a record written by train.py"
            ) from None
        key = override.key_or_group
        if key in replaced or any(key == d or key.startswith(d + ".") for d in deleted):
            continue
        problem = _problem(override, (Path(CONFIG_DIR), *config_dirs))
        if problem:
            raise ConfigError(
                f"{path}:{entry.line}: the recorded override {entry.text!r} {problem}. A "
                "resume restores values from a run folder's records, never code or Hydra "
                "settings: anyone who can write the folder could have put it there. If you "
                "trust it, give it again on the command line (with ckpt_path=...); else "
                "remove that line"
            )
    return [entry.text for entry in recorded]


def _read_lines(path: Path) -> list[RecordedOverride]:
    """The entries of ``path`` (a YAML list of strings) with their line numbers."""
    try:
        node = yaml.compose(path.read_text(), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ConfigError(
            f"{path}: cannot be read as a launch record ({error}); expected the list of "
            "overrides train.py writes"
        ) from None
    if node is None:
        return []
    items = node.value if isinstance(node, yaml.SequenceNode) else None
    if items is None or not all(isinstance(i, yaml.ScalarNode) for i in items):
        raise ConfigError(
            f"{path}: not a list of overrides; expected the list of overrides train.py writes"
        )
    return [RecordedOverride(str(item.value), item.start_mark.line + 1) for item in items]


def _problem(override: Override, config_dirs: tuple[Path, ...]) -> str | None:
    """Why ``override`` may not be restored from a record, in words; ``None``: it may."""
    key = override.key_or_group
    text = override.input_line or ""
    named = [k for k in INSTANTIATION_KEYS if k in text]
    if named:
        return f"names {named[0]} (Hydra would call the code it names)"
    parsers = [r for r in TEXT_TO_CONFIG if r in text]
    if parsers:
        return f"uses {parsers[0]} (it builds config from text, code included)"
    if key == "hydra" or key.startswith(("hydra.", "hydra/")) or override.package == "hydra":
        return "sets Hydra's own settings (train.py never records them there)"
    folders = [d / key for d in config_dirs if (d / key).is_dir()]
    if folders and not override.is_delete():
        value = override.value()
        options = {p.stem for f in folders for p in f.glob("*.yaml")}
        picked = value if isinstance(value, list) else [] if value is None else [value]
        unknown = [v for v in picked if not isinstance(v, str) or v not in options]
        if unknown:
            return f"picks {unknown[0]!r}, which is not an option of the config group {key!r}"
    return None
