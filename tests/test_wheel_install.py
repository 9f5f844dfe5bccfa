"""The wheel, installed on its own, composes every command's config and runs the console
scripts from any folder.

The wheel is built from a copy of the checkout (so no build/ or .egg-info lands in it)
and installed into a fresh venv. That venv sees the current venv's third-party packages
through a .pth line: a folder added that way does not get its own .pth files read, so
the editable install of this checkout (a .pth there) stays invisible, and every segscale
module, config and Hydra plugin the commands use must come from the wheel.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from contextlib import ExitStack
from pathlib import Path
from tempfile import TemporaryFile

import numpy as np
import pytest
from PIL import Image
from setuptools.config.pyprojecttoml import load_file

from tests.conftest import REPO

TIMEOUT_S = 600

DATA_OVERRIDES = [
    "datamodule.source.num_train=2",
    "datamodule.source.num_val=1",
    "datamodule.source.image_size=192",
]
"""A tiny synthetic dataset (tests/conftest.py tiny_overrides); root= is added per test."""

TRAIN_OVERRIDES = [
    "datamodule.patch_size=64",
    "datamodule.patches_per_image=8",
    "datamodule.batch_size=4",
    "datamodule.num_workers=0",
    "trainer.accelerator=cpu",
    "trainer.log_every_n_steps=1",
]
"""The rest of tiny_overrides, less trainer.max_epochs: the user's preset sets that."""

PRESET = """\
# @package _global_
trainer:
  max_epochs: 1
seed: 7
"""
"""``experiment/mine.yaml`` of the user's own config folder."""


def _build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for folder in ("src", "conf"):
        shutil.copytree(
            REPO / folder,
            source / folder,
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "local"),
        )
    wheels = tmp_path / "wheels"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    _run([*command, "-w", str(wheels), str(source)], cwd=tmp_path)
    (wheel,) = wheels.glob("segscale-*.whl")
    return wheel


def _install(wheel: Path, venv: Path) -> Path:
    """A venv holding the wheel, seeing this venv's packages but not the checkout."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=venv.parent)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run([*pip, "install", "--no-deps", "--no-index", str(wheel)], cwd=venv.parent)
    purelib = Path(_run([str(python), "-c", _PURELIB], cwd=venv.parent).stdout.strip())
    (purelib / "_third_party.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return purelib


_PURELIB = "import sysconfig; print(sysconfig.get_path('purelib'))"

PRIMARY = ("train", "bench", "predict", "evaluate", "export", "data")
"""Each command's config (conf/<name>.yaml)."""

_WHERE = (
    "import json, sys, segscale, segscale.configs, hydra_plugins.segscale_plugins as plugins;"
    "from segscale.configs import compose_config;"
    "import segscale.cli.train;"  # its resolver: train's and bench's run folder
    f"hydras = {{n: compose_config(n, return_hydra_config=True).hydra for n in {PRIMARY!r}}};"
    "print(json.dumps([segscale.__file__, segscale.configs.CONFIG_DIR, plugins.__file__,"
    " segscale.__version__, sys.path, {n: [h.runtime.choices.hydra, h.job_logging.handlers"
    ".file.encoding, h.callbacks.output_folder._target_, [s.path for s in"
    " h.runtime.config_sources if s.provider == 'main']] for n, h in hydras.items()}]))"
)


def _environment() -> dict[str, str]:
    # Nothing of the checkout may leak in through the environment either.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    (result,) = _run_together((command, cwd))
    return result


def _run_together(*commands: tuple[list[str], Path]) -> list[subprocess.CompletedProcess]:
    """Run independent ``(command, cwd)`` at once; each must exit 0.

    Each console script spends most of its time importing, on one core: side by side,
    two of them take about the time of one on CI's two cores. Their output goes to files
    (a full pipe would stall a process until its turn to be read).
    """
    with ExitStack() as stack:
        outputs = [
            (stack.enter_context(TemporaryFile("w+")), stack.enter_context(TemporaryFile("w+")))
            for _ in commands
        ]
        started = [
            subprocess.Popen(
                command, cwd=cwd, env=_environment(), stdout=out, stderr=err, text=True
            )
            for (command, cwd), (out, err) in zip(commands, outputs, strict=True)
        ]
        try:
            for process in started:
                process.wait(timeout=TIMEOUT_S)
        finally:
            for process in started:
                if process.poll() is None:  # no process left behind, whatever failed
                    process.kill()
                    process.wait()
        results = []
        for process, (out, err) in zip(started, outputs, strict=True):
            out.seek(0)
            err.seek(0)
            results.append(
                subprocess.CompletedProcess(
                    process.args, process.returncode, out.read(), err.read()
                )
            )
    for result in results:
        assert result.returncode == 0, (
            f"{result.args} exited {result.returncode}\n{result.stdout[-3000:]}\n"
            f"{result.stderr[-5000:]}"
        )
    return results


def test_every_package_of_src_is_in_the_wheel():
    """``packages`` names them (conf/ sits outside src/, where no ``find`` maps it)."""
    setuptools = load_file(REPO / "pyproject.toml")["tool"]["setuptools"]
    on_disk = {
        ".".join(init.parent.relative_to(REPO / "src").parts)
        for init in (REPO / "src").rglob("__init__.py")
    }
    # hydra_plugins, a namespace, too: else an editable install hides segscale's plugins.
    assert set(setuptools["packages"]) == {*on_disk, "hydra_plugins", "segscale.conf"}
    assert setuptools["package-dir"] == {"": "src", "segscale.conf": "conf"}
    assert (REPO / "conf" / "__init__.py").is_file()  # found as a package, editable too


@pytest.mark.slow
def test_the_installed_wheel_trains_predicts_and_evaluates_from_anywhere(tmp_path: Path):
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "venv"
    purelib = _install(wheel, venv)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bin_dir = venv / "bin"

    myconf = tmp_path / "myconf"
    (myconf / "experiment").mkdir(parents=True)
    (myconf / "experiment" / "mine.yaml").write_text(PRESET)
    data = [f"datamodule.source.root={tmp_path / 'data'}", *DATA_OVERRIDES]
    run = tmp_path / "run"
    train = [str(bin_dir / "segscale-train"), *data, *TRAIN_OVERRIDES, "experiment=mine"]

    # Three independent commands at once: where the modules come from; the search path
    # override finding the user's preset (--cfg job prints the config only); and a
    # training with Hydra's options before the overrides (argparse takes no option after
    # them).
    where, searched, _ = _run_together(
        ([str(bin_dir / "python"), "-c", _WHERE], elsewhere),
        ([train[0], "--cfg", "job", *train[1:], f"hydra.searchpath=[file://{myconf}]"], elsewhere),
        ([train[0], "--config-dir", str(myconf), *train[1:], f"hydra.run.dir={run}"], elsewhere),
    )
    module_file, config_dir, plugins_file, version, path, composed = json.loads(where.stdout)
    for installed in (module_file, config_dir, plugins_file):
        assert Path(installed).is_relative_to(purelib), installed
    assert Path(config_dir) == purelib / "segscale" / "conf"
    assert version == "0.1.0"
    assert not any(Path(entry).is_relative_to(REPO / "src") for entry in path if entry), path
    # Every command's config composes from the wheel's own tree, the shared Hydra block too.
    assert set(composed) == set(PRIMARY)
    for choice, encoding, check, sources in composed.values():
        assert (choice, encoding) == ("default", "utf-8")
        assert check == "segscale.output_folder_check.OutputFolderCheck"
        assert sources == [config_dir], sources

    assert "seed: 7" in searched.stdout and "max_epochs: 1" in searched.stdout

    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["epochs"] == 1
    assert "seed: 7" in (run / ".hydra" / "config.yaml").read_text()
    best = run / "checkpoints" / "best.ckpt"
    assert best.is_file()

    # Prediction and evaluation only read the checkpoint and the data: at once too.
    images = sorted((tmp_path / "data").rglob("val/images/*.png"))
    assert images
    predict = [str(bin_dir / "segscale-predict"), f"ckpt={best}", f"input={images[0].parent}"]
    evaluate = [str(bin_dir / "segscale-evaluate"), f"ckpt={best}", *data, "accelerator=cpu"]
    _run_together(
        ([*predict, "accelerator=cpu", f"hydra.run.dir={tmp_path / 'predicted'}"], elsewhere),
        ([*evaluate, f"hydra.run.dir={tmp_path / 'evaluated'}"], elsewhere),
    )
    for image in images:
        mask = np.asarray(Image.open(tmp_path / "predicted" / f"{image.stem}.png"))
        assert mask.shape == (192, 192) and mask.max() < 6
        assert (tmp_path / "predicted" / f"{image.stem}_overlay.png").is_file()

    metrics = json.loads((tmp_path / "evaluated" / "metrics.json").read_text())
    assert 0 <= metrics["MeanIoU"] <= 1
    assert (tmp_path / "evaluated" / "confusion_matrix.csv").is_file()
    assert not list(elsewhere.iterdir())  # every output went where it was told to go
