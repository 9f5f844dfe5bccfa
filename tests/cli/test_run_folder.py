"""One run, one folder, one record: concurrent runs, fresh runs, failed and good resumes."""

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from segscale.cli.train import main
from segscale.errors import ConfigError
from segscale.runs.folder import RunFolderLock
from segscale.training.run.training_run import train
from tests.conftest import tiny_overrides, train_command
from tests.helpers.in_process import run_in_process

# 2 epochs of 4 iterations, a checkpoint every 3 iterations (mid-epoch ones included).
RUN = [
    "trainer.max_epochs=2",
    "callbacks.periodic_checkpoint.frequency=3",
    "callbacks.periodic_checkpoint.unit=iteration",
]


def overrides(data_root: Path, run: Path, *extra: str) -> list[str]:
    return [*tiny_overrides(data_root, None), *RUN, f"hydra.run.dir={run}", *extra]


def launch(data_root: Path, run: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``python train.py`` into ``run``, in this process: no 9 s of imports."""
    return run_in_process(main, *overrides(data_root, run, *extra), cwd=run.parent)


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file of a run folder but its log, by content."""
    return {
        str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "train.log"
    }


@pytest.mark.slow
def test_one_run_one_folder_one_record(tiny_data_root, tmp_path):
    run = tmp_path / "run"
    # The first run is a process of its own: the second finds it alive, by its pid.
    first = subprocess.Popen(
        train_command(*overrides(tiny_data_root, run)),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while not (run / ".lock").is_file() or not (run / ".lock").read_text():
        assert first.poll() is None and time.monotonic() < deadline, "the run never held its folder"
        time.sleep(0.02)

    # A second run into the folder of a live one is refused, naming the holder.
    second = launch(tiny_data_root, run)
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"in use by another run (pid {first.pid} on host" in second.stdout + second.stderr
    output, _ = first.communicate(timeout=300)
    assert first.returncode == 0, output[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 8
    assert sorted(p.name for p in (run / ".hydra").iterdir()) == [
        "config.yaml",
        "hydra.yaml",
        "overrides.yaml",
    ]
    assert not (run / ".lock").exists()

    # A fresh run into a finished run's folder is refused too.
    fresh = launch(tiny_data_root, run)
    assert fresh.returncode == 2 and "already holds a run" in fresh.stdout + fresh.stderr

    # A resume that changes the network fails before anything changes.
    before = fingerprint(run)
    early = run / "checkpoints" / "epoch000-step0000003.ckpt"
    wrong = launch(tiny_data_root, run, "model=unet", f"ckpt_path={early}")
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    out = wrong.stdout + wrong.stderr
    assert "model.arch: the run was started with 'DeepLabV3Plus', this launch has 'Unet'" in out
    assert fingerprint(run) == before

    # Resuming from a checkpoint older than best.ckpt: best and last are rewritten in
    # place (no best-v1.ckpt), and the launch gets its own record.
    resumed = launch(tiny_data_root, run, f"ckpt_path={early}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert not [n for n in names if "-v" in n], names
    summary = json.loads((run / "summary.json").read_text())
    assert Path(summary["best_checkpoint"]).name == "best.ckpt"
    assert Path(summary["last_checkpoint"]).name == "last.ckpt"
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 8
    assert fingerprint(run)[".hydra/config.yaml"] == before[".hydra/config.yaml"]
    assert (run / ".hydra" / "launch-2" / "overrides.yaml").is_file()
    assert f"ckpt_path={early}" in (run / ".hydra" / "launch-2" / "overrides.yaml").read_text()


def test_resuming_into_another_architecture_names_the_keys(make_config, tmp_path, tiny_run):
    last = tiny_run / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError) as error:
        # Into a folder without the run's record: the run's own refuses model.* first.
        train(make_config("model=fpn", f"ckpt_path={last}", f"output_dir={tmp_path / 'other'}"))
    message = str(error.value)
    assert f"ckpt_path='{last}' holds another network" in message
    assert "missing: network.decoder." in message and "unexpected: network.decoder." in message
    assert "more)" in message


def test_a_refused_run_writes_nothing_into_the_live_runs_log(tiny_data_root, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("the live run's log\n")
    with RunFolderLock(run):  # the live run, here this process (the lock is exclusive in it too)
        refused = launch(tiny_data_root, run)
    assert refused.returncode == 2
    assert f"in use by another run (pid {os.getpid()}" in refused.stdout + refused.stderr
    assert (run / "train.log").read_text() == "the live run's log\n"
