"""``ckpt_path=last`` alone continues a run as it was started; a frozen change is refused."""

import csv
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from segscale.cli.train import main
from tests.conftest import tiny_overrides
from tests.in_process import run_in_process


def started_with(data_root: Path) -> list[str]:
    """The tiny overrides, with a batch of 2 (not the default 8) for 1 epoch of 4 steps."""
    changed = ("datamodule.batch_size=", "trainer.max_epochs=", "datamodule.patches_per_image=")
    keep = [o for o in tiny_overrides(data_root, None) if not o.startswith(changed)]
    return [
        *keep,
        "datamodule.batch_size=2",
        "trainer.max_epochs=1",
        "datamodule.patches_per_image=4",
    ]


def files(folder: Path) -> dict[str, str]:
    """Every file of a run folder but its log, by content."""
    return {
        str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "train.log"
    }


def launch(cwd: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """``python train.py OVERRIDES`` in ``cwd``, run in this process (no 9 s of imports)."""
    return run_in_process(main, *overrides, cwd=cwd)


@pytest.mark.slow
def test_ckpt_path_last_alone_continues_the_run(tiny_data_root, tmp_path):
    first = launch(tmp_path, *started_with(tiny_data_root))
    assert first.returncode == 0, first.stderr[-3000:]
    (run,) = (tmp_path / "outputs" / "train").iterdir()
    first_config = (run / ".hydra" / "config.yaml").read_text()

    resumed = launch(tmp_path, "ckpt_path=last", "trainer.max_epochs=2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert list((tmp_path / "outputs" / "train").iterdir()) == [run]
    summary = json.loads((run / "summary.json").read_text())
    # 2 tiles × 4 patches in batches of 2: 4 steps an epoch.
    assert summary["epochs"] == 2 and summary["steps"] == 8
    assert summary["scaling"]["global_batch_size"] == 2
    relaunched = OmegaConf.load(run / ".hydra" / "launch-2" / "config.yaml")
    assert relaunched.datamodule.batch_size == 2 and relaunched.trainer.max_epochs == 2
    recorded = OmegaConf.load(run / ".hydra" / "launch-2" / "overrides.yaml")
    assert "datamodule.batch_size=2" in recorded and "ckpt_path=last" in recorded
    assert (run / ".hydra" / "config.yaml").read_text() == first_config
    assert "restored the run's overrides" in (run / "train.log").read_text()

    before = files(run)
    refused = launch(tmp_path, "ckpt_path=last", "datamodule.batch_size=8")
    assert refused.returncode == 2, refused.stderr[-3000:]
    output = refused.stdout + refused.stderr
    assert "datamodule.batch_size: the run was started with 2, this launch has 8" in output
    assert "Traceback" not in output
    assert files(run) == before


# A callback of the user's own, given on the command line when the run started.
OWN_CALLBACK = "+callbacks.timer._target_=lightning.pytorch.callbacks.Timer"


@pytest.mark.slow
def test_a_resume_runs_no_code_written_into_the_run_folders_records(tiny_data_root, tmp_path):
    first = launch(tmp_path, *started_with(tiny_data_root), OWN_CALLBACK)
    assert first.returncode == 0, first.stderr[-3000:]
    (run,) = (tmp_path / "outputs" / "train").iterdir()

    # Someone who can write a copy of the folder appends code to its launch record.
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    records = copy / ".hydra" / "overrides.yaml"
    lines = records.read_text().splitlines()
    marker = tmp_path / "ran.txt"
    evil = ["_target_=numpy.savetxt", f"fname={marker}", "X=[1]"]
    records.write_text("\n".join([*lines, *(f"- +callbacks.evil.{e}" for e in evil), ""]))
    before = files(copy)
    ckpt = f"ckpt_path={copy / 'checkpoints' / 'last.ckpt'}"
    refused = launch(tmp_path, ckpt, "trainer.max_epochs=2", OWN_CALLBACK)
    output = refused.stdout + refused.stderr
    assert refused.returncode == 2, output[-3000:]
    assert f"{records}:{len(lines) + 1}: the recorded override" in output
    assert "names _target_" in output and "Traceback" not in output
    assert not marker.exists() and files(copy) == before

    # The run's own callback, recorded, is restored only when the command line gives it.
    (own_line,) = [n for n, line in enumerate(lines, 1) if OWN_CALLBACK in line]
    untrusted = launch(tmp_path, "ckpt_path=last", "trainer.max_epochs=2")
    assert untrusted.returncode == 2
    recorded = (run / ".hydra" / "overrides.yaml").relative_to(tmp_path)
    assert f"{recorded}:{own_line}: the recorded override" in untrusted.stderr
    resumed = launch(tmp_path, "ckpt_path=last", "trainer.max_epochs=2", OWN_CALLBACK)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["epochs"] == 2


@pytest.mark.slow
def test_a_learning_rate_given_on_resume_applies(tiny_data_root, tmp_path):
    constant = ["scheduler=none", "optimizer.lr=0.03"]  # the rate of every step: the base
    first = launch(tmp_path, *started_with(tiny_data_root), *constant)
    assert first.returncode == 0, first.stderr[-3000:]
    (run,) = (tmp_path / "outputs" / "train").iterdir()

    resumed = launch(tmp_path, "ckpt_path=last", "trainer.max_epochs=2", "optimizer.lr=0.3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["learning_rate"] == pytest.approx(0.3)
    assert summary["scaling"]["learning_rate"] == pytest.approx(0.3)
    with (run / "metrics.csv").open() as rows:
        rates = {
            int(row["step"]): float(row["lr-SGD"]) for row in csv.DictReader(rows) if row["lr-SGD"]
        }
    # 4 steps an epoch: the first launch's at 0.03, the resumed one's at 0.3.
    assert sorted(rates) == list(range(8))
    assert [rates[s] for s in range(8)] == pytest.approx([0.03] * 4 + [0.3] * 4)
