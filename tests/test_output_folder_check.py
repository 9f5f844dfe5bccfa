import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

from segscale.cli.predict import main as predict_main
from segscale.cli.train import main as train_main
from segscale.configs import CONFIG_DIR
from segscale.output_folder_check import EXIT_BAD_INPUT, check_output_folder, unwritable_reason
from tests.conftest import tiny_overrides, train_command
from tests.helpers.in_process import run_in_process

ROOT = os.geteuid() == 0
"""Root may write into any folder: those cases drop the capability that allows it."""


def test_writable_and_creatable_folders_pass(tmp_path):
    assert unwritable_reason(tmp_path) is None
    assert unwritable_reason(tmp_path / "new" / "deeper" / "run") is None
    assert not (tmp_path / "new").exists()  # nothing is created


def test_a_file_in_the_path_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    assert unwritable_reason(tmp_path / "file" / "run") == f"{tmp_path / 'file'} is a file"
    assert unwritable_reason(tmp_path / "file") == f"{tmp_path / 'file'} is a file"
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    assert "not a folder" in unwritable_reason(tmp_path / "link" / "run")


SETPRIV = shutil.which("setpriv")


@pytest.fixture
def unprivileged(tmp_path: Path) -> Path:
    """``tmp_path``, with a read-only folder ``read_only`` in it, for tests of mode bits.

    Root writes into any folder (the capability CAP_DAC_OVERRIDE), and CI runs as root:
    there the test's commands run without that capability (``as_user``), so that mode
    bits bind them as they bind any user. Skipped where that cannot be done, saying why.
    """
    if ROOT and SETPRIV is None:
        pytest.skip("as root, and without util-linux's setpriv to drop CAP_DAC_OVERRIDE")
    (tmp_path / "read_only").mkdir(mode=0o500)
    return tmp_path


def as_user(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``command``, as root without the capabilities that override mode bits."""
    if ROOT:
        assert SETPRIV is not None  # the fixture skipped otherwise
        command = [SETPRIV, "--bounding-set=-dac_override,-dac_read_search", "--", *command]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_a_read_only_folder_is_refused(unprivileged):
    folder = unprivileged / "read_only"
    script = (
        "import sys; from segscale.output_folder_check import unwritable_reason; "
        "print(unwritable_reason(sys.argv[1])); print(unwritable_reason(sys.argv[2]))"
    )
    done = as_user(
        [sys.executable, "-c", script, str(folder), str(folder / "a" / "b")], cwd=unprivileged
    )
    assert done.returncode == 0, done.stderr[-2000:]
    here, deeper = done.stdout.splitlines()
    assert here == "the folder is not writable"
    assert "where it would be created, is not writable" in deeper


def test_the_callback_resolves_the_folder_as_hydra_will(tmp_path):
    (tmp_path / "file").write_text("")
    # ${hydra:...} resolves only once Hydra has set its config, in run_job.
    run_dir = f"{tmp_path}/file/${{hydra:job.name}}"
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", [f"hydra.run.dir={run_dir}"], return_hydra_config=True)
    previous = HydraConfig.instance().cfg
    with pytest.raises(SystemExit) as stop:
        check_output_folder(cfg, "hydra.run.dir")
    assert stop.value.code == EXIT_BAD_INPUT
    assert HydraConfig.instance().cfg is previous  # left as it was
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", [f"hydra.run.dir={tmp_path}/run"], return_hydra_config=True)
    check_output_folder(cfg, "hydra.run.dir")


@pytest.mark.parametrize("name", ["train", "bench", "predict", "evaluate", "export", "data"])
def test_every_entry_point_registers_the_check(name):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(name, return_hydra_config=True)
    target = cfg.hydra.callbacks.output_folder._target_
    assert target == "segscale.output_folder_check.OutputFolderCheck"


def _assert_refused(code: int, output: str, key: str, folder: Path) -> None:
    assert code == 2, output[-3000:]
    assert f"{key}='{folder}' is not allowed" in output, output[-3000:]
    assert "Traceback" not in output


# The entry points run in this process (a process of their own would spend ~9 s on
# imports), in tmp_path: nothing else may appear there. The read-only case below runs
# python train.py as a process of its own, without the capability to override mode bits.
@pytest.mark.parametrize("multirun", [False, True], ids=["run", "multirun"])
def test_train_stops_before_hydra_creates_the_folder(tiny_data_root, tmp_path, multirun):
    (tmp_path / "file").write_text("")
    folder = tmp_path / "file" / "run"
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    sweep = ["-m", "optimizer.lr=0.01,0.02"] if multirun else []
    overrides = tiny_overrides(tiny_data_root, None)
    done = run_in_process(train_main, *sweep, *overrides, f"{key}={folder}", cwd=tmp_path)
    _assert_refused(done.returncode, done.stdout + done.stderr, key, folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing else written


def test_predict_stops_before_hydra_creates_the_folder(tmp_path):
    (tmp_path / "file").write_text("")
    folder = tmp_path / "file" / "out"
    args = ("ckpt=x", "input=y", f"hydra.run.dir={folder}")
    done = run_in_process(predict_main, *args, cwd=tmp_path, program="predict.py")
    _assert_refused(done.returncode, done.stdout + done.stderr, "hydra.run.dir", folder)


@pytest.mark.slow
def test_train_in_a_read_only_folder_is_refused(tiny_data_root, unprivileged):
    folder = unprivileged / "read_only"
    overrides = tiny_overrides(tiny_data_root, None)
    done = as_user(train_command(*overrides, f"hydra.run.dir={folder}/run"), unprivileged)
    _assert_refused(done.returncode, done.stdout + done.stderr, "hydra.run.dir", folder / "run")
