"""Command lines rebuilt: this program, the configs a Hydra job loaded, quoted overrides.

The rank launcher, the parallel launcher, the Optuna sweeper and the Python API all start
``train.py`` again with a job's own configs and overrides; this is what they share.
"""

from __future__ import annotations

import os
import re
import sys

from omegaconf import DictConfig, OmegaConf

TRAIN_COMMAND = (sys.executable, "-m", "segscale.cli.train")
"""``train.py`` as a module of this interpreter: found wherever segscale is installed."""

UTF8_OUTPUT = {"PYTHONIOENCODING": "utf-8"}
"""The environment in which a Python child writes its output to a file or a pipe as UTF-8,
as its parent reads it (Python's default there is the locale's encoding: cp1252 on most
Windows machines, which has no ``水`` for a class name in a log line)."""


def program_command() -> list[str]:
    """The interpreter and script (or ``-m`` module) that this process runs."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is None:
        return [sys.executable, os.path.abspath(sys.argv[0])]
    return [sys.executable, "-m", spec.name]


def config_options(hydra_cfg: DictConfig) -> list[str]:
    """The options and overrides that make another process load the configs this job loaded.

    ``hydra_cfg`` is the job's ``HydraConfig``. A user's own config folder, given with
    ``--config-dir`` or ``hydra.searchpath=[...]``, holds presets (``experiment=mine``) the
    ranks must find too; ``--config-path`` and ``--config-name`` may have replaced the
    program's primary config. Both are passed always: repeating the defaults is harmless.
    """
    options = []
    for source in OmegaConf.select(hydra_cfg, "runtime.config_sources", default=None) or []:
        if source.provider == "command-line":  # --config-dir (Hydra makes it absolute)
            options += ["--config-dir", source.path]
        elif source.provider == "main":  # the primary folder: hydra.main's or --config-path
            path = source.path if source.schema == "file" else f"{source.schema}://{source.path}"
            options += ["--config-path", path]
    config_name = OmegaConf.select(hydra_cfg, "job.config_name", default=None)
    if config_name is not None:
        options += ["--config-name", config_name]
    hydra_overrides = OmegaConf.select(hydra_cfg, "overrides.hydra", default=None) or []
    searchpath = [o for o in hydra_overrides if o.lstrip("+").startswith("hydra.searchpath=")]
    return [*options, *searchpath]


def quoted_override(value: str) -> str:
    r"""``value`` as a quoted Hydra override value, which Hydra's parser reads back as it is.

    Spaces, commas, ``=``, ``$`` and brackets stay as they are inside quotes; so do
    backslashes, but for those before a quote: Hydra 1.3 reads backslashes as escapes
    only there (``\'`` is a quote, ``\\'`` a backslash and the end), as Windows reads a
    command line. So ``C:\Users\me\data`` and ``\\server\share\x`` are written as they
    are, and only a run of backslashes before a quote (or before the closing one) is
    doubled. The quote is ``"`` where the value holds ``'`` and no ``"``, else ``'``,
    escaped inside. (A ``${`` in it is still an interpolation to OmegaConf, as in a
    config file.)
    """
    quote = '"' if "'" in value and '"' not in value else "'"
    before_quote = re.compile(rf"(\\*)({quote}|\Z)")
    escaped = before_quote.sub(lambda m: m[1] * 2 + ("\\" + m[2] if m[2] else ""), value)
    return f"{quote}{escaped}{quote}"
