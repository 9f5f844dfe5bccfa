"""A run folder's recorded overrides, read as data: what a resume may restore from them.

A resume (``ckpt_path=last`` or a path) puts the overrides of the run's latest launch
record back in front of the command line's (``relaunch.restore_overrides``). The record
is a file in a run folder, which anyone who can write there can edit (a shared folder, a
copied run, a folder planted under ``outputs/<task>/`` for ``ckpt_path=last`` to pick),
and Hydra calls whatever ``_target_`` a composed config names. OmegaConf also assembles
resolver names from interpolations, so no list of bad substrings can tell code from
values. A record therefore restores values by allow-list: ``restorable_overrides``
accepts an override in these forms only, and restores it as segscale writes it from the
parsed key and value, never as the file's text:

- ``key=value``, the key made of names (a letter, then letters, digits, ``_`` or ``-``;
  so never one of Hydra's ``_target_``, ``_args_``, ...) or list positions, the value a
  plain literal: a number, ``true``/``false``, ``null``, a string of printable
  characters without ``${`` (an interpolation's start; a Windows path's backslashes and
  a share's ``$`` are kept), or a list of them;
- ``group=option`` for a config group of the package's config folder or the user's
  (``--config-dir``, ``hydra.searchpath``), the option one of the group's files by name
  (or a list of them, or ``null``).

Everything else is refused, naming the file, the line and why: additions (``+``,
``++``), deletions (``~``), packages (``@``), Hydra's own settings (``hydra.*``,
``hydra/...``: Hydra records those apart, never in ``overrides.yaml``), sweeps, functions,
dictionaries, interpolations and resolvers. ``relaunch`` adds the checks that need the
composed config (the key exists, the run folder is the same, and ``restored_writes``: no
write outside the run folder that the config would not make) on what this module
returns, so what is checked is what is merged.

An override the command line gives again (the same key) or deletes (``~key`` or a key
above it) is not restored, so not checked: a run started with a callback of one's own
(``+callbacks.x._target_=...``) resumes when the command line gives it again.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException

from segscale.command_line import quoted_override
from segscale.configs import CONFIG_DIR
from segscale.errors import ConfigError

MAX_RECORD_BYTES = 1 << 20
"""A launch record larger than this is not one train.py wrote (it holds a command line)."""
MAX_LINE = 4096
"""The longest recorded override restored (a path's length limit on Linux)."""
_NAME = r"[A-Za-z][A-Za-z0-9_-]*"
KEY = re.compile(rf"{_NAME}(?:\.(?:{_NAME}|[0-9]+))*")
"""A config key that may be restored: names, or list positions after the first."""
GROUP = re.compile(rf"{_NAME}(?:/{_NAME})*")
"""A config group's path (``model``, ``datamodule/classes``)."""
OPTION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
"""A group option's name: a file of the group, never a path."""
MAX_LIST_DEPTH = 3


@dataclass(frozen=True)
class RecordedOverride:
    """One override of a launch record: its text, and where it is."""

    text: str
    path: Path
    line: int

    @property
    def where(self) -> str:
        """``<file>:<line>``, for messages."""
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Restorable:
    """A recorded override a resume restores: its key, its value, the text segscale writes."""

    key: str
    value: Any
    is_group: bool
    text: str
    recorded: RecordedOverride


def restorable_overrides(
    path: Path, given: Sequence[str], config_dirs: tuple[Path, ...] = ()
) -> list[Restorable]:
    """The overrides of ``path`` (an ``overrides.yaml``) that a resume restores, checked.

    ``given`` are the command line's overrides: a recorded override whose key they set
    again or delete is not restored (nor checked), and neither is a recorded
    ``ckpt_path``. ``config_dirs`` are the user's config folders besides the package's,
    whose group options count. Raises ``ConfigError`` naming the file and line of the
    first override that is not in one of the forms the module docstring lists.
    """
    parser = OverridesParser.create()
    given_parsed = parser.parse_overrides(list(given))
    replaced = {(o.key_or_group, o.package) for o in given_parsed if not o.is_delete()}
    deleted = tuple(o.key_or_group for o in given_parsed if o.is_delete())
    folders = (Path(CONFIG_DIR), *config_dirs)
    restored = []
    for recorded in read_record(path):
        override = _parse(parser, recorded)
        key = override.key_or_group
        if key == "ckpt_path" or (key, override.package) in replaced:
            continue
        if any(key == d or key.startswith((d + ".", d + "/")) for d in deleted):
            continue
        restored.append(_restorable(parser, override, recorded, folders))
    return restored


def read_record(path: Path) -> list[RecordedOverride]:
    """The entries of ``path`` (a YAML list of strings) with their line numbers."""
    try:
        size = path.stat().st_size
        if size > MAX_RECORD_BYTES:
            raise ConfigError(
                f"{path}: {size} bytes is not a launch record train.py writes (at most "
                f"{MAX_RECORD_BYTES}); expected the list of overrides of a run's command line"
            )
        node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ConfigError(
            f"{path}: cannot be read as a launch record ({error}); expected the list of "
            "overrides train.py writes"
        ) from None
    if node is None:
        return []
    items = node.value if isinstance(node, yaml.SequenceNode) else None
    plain = "tag:yaml.org,2002:str"
    if items is None or not all(isinstance(i, yaml.ScalarNode) and i.tag == plain for i in items):
        raise ConfigError(
            f"{path}: not a list of overrides; expected the list of overrides train.py writes"
        )
    return [RecordedOverride(str(i.value), path, i.start_mark.line + 1) for i in items]


def refusal(recorded: RecordedOverride, why: str) -> ConfigError:
    """The error for a recorded override that is not restored: file, line, why, what to do."""
    shown = recorded.text if len(recorded.text) <= 200 else recorded.text[:200] + "..."
    return ConfigError(
        f"{recorded.where}: the recorded override {shown!r} {why}. A resume restores "
        "only plain values of existing keys and config-group options from a run folder's "
        "records, never code, additions or Hydra settings: anyone who can write the "
        "folder could have put it there. If you trust it, give it again on the command "
        "line (with ckpt_path=...); else remove that line"
    )


def _parse(parser: OverridesParser, recorded: RecordedOverride) -> Override:
    """``recorded`` parsed as Hydra would; refused unless it is one override."""
    if len(recorded.text) > MAX_LINE:
        raise refusal(recorded, f"is longer than {MAX_LINE} characters")
    try:
        (override,) = parser.parse_overrides([recorded.text])
    except (HydraException, ValueError) as error:
        raise refusal(recorded, f"is not an override Hydra reads ({error})") from None
    return override


def _restorable(
    parser: OverridesParser,
    override: Override,
    recorded: RecordedOverride,
    folders: tuple[Path, ...],
) -> Restorable:
    """``override`` as segscale restores it, or the refusal saying why it is not."""
    if override.type != OverrideType.CHANGE:
        kind = "deletes a key (~)" if override.is_delete() else "adds a key (+ or ++)"
        raise refusal(recorded, kind)
    if override.package is not None:
        raise refusal(recorded, "places a config with @package")
    key = override.key_or_group
    if key == "hydra" or key.startswith(("hydra.", "hydra/")):
        raise refusal(recorded, "sets Hydra's own settings (train.py never records them there)")
    if override.is_sweep_override():
        raise refusal(recorded, "is a sweep, not one value")
    group = [d / key for d in folders if GROUP.fullmatch(key) and (d / key).is_dir()]
    if group or "/" in key:
        if not group:
            raise refusal(recorded, f"names {key!r}, which is not a config group")
        text = f"{key}={_options(override.value(), group, key, recorded)}"
    elif KEY.fullmatch(key):
        text = f"{key}={_literal(override.value(), recorded)}"
    else:
        raise refusal(recorded, f"sets {key!r}, which is not a plain config key")
    # What Hydra reads back from the text segscale wrote must be what was checked.
    (written,) = parser.parse_overrides([text])
    if (written.key_or_group, written.type, written.package) != (key, OverrideType.CHANGE, None):
        raise refusal(recorded, "does not read back as written")
    if not _same(written.value(), override.value()):
        raise refusal(recorded, "does not read back as written")
    return Restorable(key, override.value(), bool(group), text, recorded)


def _options(value: Any, groups: list[Path], key: str, recorded: RecordedOverride) -> str:
    """A group choice as written: an option, a list of options, or ``null``."""
    if value is None:
        return "null"
    picked = value if isinstance(value, list) else [value]
    options = {p.stem for folder in groups for p in folder.glob("*.yaml")}
    for option in picked:
        if not (isinstance(option, str) and OPTION.fullmatch(option) and option in options):
            raise refusal(
                recorded, f"picks {option!r}, which is not an option of the config group {key!r}"
            )
    return f"[{','.join(picked)}]" if isinstance(value, list) else str(value)


def _literal(value: Any, recorded: RecordedOverride, depth: int = 0) -> str:
    """``value`` written as a plain literal; refused unless it is one."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # inf, -inf, nan and exponents read back as Hydra's floats
    if isinstance(value, str):
        return _string(value, recorded)
    if isinstance(value, list) and depth < MAX_LIST_DEPTH:
        return "[" + ",".join(_literal(v, recorded, depth + 1) for v in value) + "]"
    raise refusal(
        recorded,
        f"has a {type(value).__name__} value; expected a number, true/false, null, a "
        "string or a list of them",
    )


def _string(value: str, recorded: RecordedOverride) -> str:
    """A plain string quoted for Hydra: printable, no interpolation.

    OmegaConf reads a string as an interpolation (a resolver, code) only where it holds
    ``${``; a backslash is an escape to it only there, and to Hydra's parser only before
    a quote, which ``quoted_override`` doubles.
    """
    if "${" in value:
        raise refusal(recorded, "has a value with '${' (an interpolation)")
    if any(unicodedata.category(c).startswith(("C", "Z")) and c != " " for c in value):
        raise refusal(recorded, "has a value with a control or separator character")
    if "'" in value and '"' in value:
        raise refusal(recorded, "has a value with both kinds of quotes")
    return quoted_override(value)


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types (``nan`` equal to itself), lists element by element."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)
