"""Each command's log file (``<task>.log``) is written as UTF-8, whatever the locale.

Hydra's own ``hydra/job_logging=default`` opens the file in the locale's encoding
(cp1252 on most Windows machines, ASCII under ``LC_ALL=C``), which loses every line with
a character it lacks (a class named ``水``, a path in another script). Each command's
config selects ``conf/hydra/job_logging/utf8.yaml`` instead: Hydra's, the file in UTF-8.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from segscale.configs import compose_config

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ("train", "predict", "evaluate", "bench", "data", "export")
"""The configs of the commands that write a run folder, and so a log file."""
CLASSES = ["Straße", "水", "café", "tree", "car", "clutter"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_commands_log_file_is_written_as_utf8(command):
    hydra = compose_config(command, return_hydra_config=True).hydra
    assert hydra.runtime.choices["hydra/job_logging"] == "utf8"
    handler = OmegaConf.to_container(hydra.job_logging.handlers.file)
    assert handler["class"] == "logging.FileHandler"
    assert handler["encoding"] == "utf-8"
    assert handler["filename"] == "${hydra.runtime.output_dir}/${hydra.job.name}.log"
    assert hydra.job_logging.root.handlers == ["console", "file"]


def test_a_command_line_choice_of_hydras_logging_still_wins():
    # What a DDP job's other ranks are given (segscale.training.ranks.launch).
    hydra = compose_config("train", ["hydra/job_logging=none"], return_hydra_config=True).hydra
    assert "handlers" not in hydra.job_logging


@pytest.mark.slow
def test_a_runs_log_holds_non_ascii_lines_in_a_locale_that_has_none(tmp_path):
    # data.py's class table names the classes of a classes file (config files are read
    # as UTF-8); its Python's locale encoding is ASCII, as strict as cp1252 and stricter.
    classes = tmp_path / "conf/datamodule/classes/named.yaml"
    classes.parent.mkdir(parents=True)
    potsdam = (REPO / "conf/datamodule/classes/potsdam.yaml").read_text("utf-8")
    names = "class_names: [impervious_surface, building, low_vegetation, tree, car, clutter]"
    assert names in potsdam
    classes.write_text(potsdam.replace(names, f"class_names: [{', '.join(CLASSES)}]"), "utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONUTF8"))}
    env |= {"LC_ALL": "C", "LANG": "C", "PYTHONPATH": os.pathsep.join(sys.path)}
    run = tmp_path / "run"
    command = [sys.executable, "-X", "utf8=0", str(REPO / "data.py")]
    command += ["--config-dir", str(tmp_path / "conf"), "datamodule/classes=named"]
    command += [f"hydra.run.dir={run}"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, encoding="utf-8")
    assert done.returncode == 0, done.stderr[-3000:]
    log = (run / "data.log").read_bytes().decode("utf-8")  # strict: UTF-8 or an error
    rows = [line.split()[0] for line in log.splitlines() if line.startswith("  ")]
    assert [name for name in CLASSES if name in rows] == CLASSES, log
