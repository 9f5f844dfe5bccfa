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
from segscale.configs import CONFIG_DIR
from tests.conftest import tiny_overrides
from tests.helpers.in_process import run_in_process


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


@pytest.fixture(scope="module")
def started_run(tiny_data_root, tmp_path_factory) -> Path:
    """A finished one-epoch run with a callback of its own, and a second launch record."""
    cwd = tmp_path_factory.mktemp("started")
    first = launch(cwd, *started_with(tiny_data_root), OWN_CALLBACK)
    assert first.returncode == 0, first.stderr[-3000:]
    (run,) = (cwd / "outputs" / "train").iterdir()
    shutil.copytree(run / ".hydra", run / ".hydra" / "launch-2", ignore=_no_subfolders)
    return run


def _no_subfolders(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if (Path(folder) / n).is_dir()]


def _climb_to(path: Path) -> str:
    """``path`` as a relative option of the model group: up from its folder, then down."""
    depth = len((Path(CONFIG_DIR) / "model").resolve().parts) - 1
    return "../" * depth + str(path).lstrip("/")


def _attacks(marker: Path) -> dict[str, tuple[str, str, str]]:
    """Name → (record file, line appended or file text, what the refusal says)."""
    write = f"numpy.savetxt, fname: {marker}, X: [1]"
    built = '${oc.${oc.select:nx,create}:"{_tar${oc.select:nx,get_}: ' + write + '}"}'
    evil = marker.parent / "evil"  # evil.yaml, written by the test
    return {
        # Both ran the code under the substring check this allow-list replaced.
        "resolver-built target": ("overrides.yaml", f"+callbacks.pwn='{built}'", "adds a key"),
        "resolver-built target, launch-2": (
            "launch-2/overrides.yaml",
            f"+callbacks.pwn='{built}'",
            "adds a key",
        ),
        "outside yaml through a package": (
            "launch-2/overrides.yaml",
            f"+model@callbacks.pwn={_climb_to(evil)}",
            "adds a key",
        ),
        "an existing target": (
            "launch-2/overrides.yaml",
            "callbacks.model_checkpoint._target_=numpy.savetxt",
            "not a plain config key",
        ),
        "environment": (
            "launch-2/overrides.yaml",
            "callbacks.model_checkpoint.filename=${oc.env:HOME}",
            "an interpolation",
        ),
        "nested resolvers": (
            "launch-2/overrides.yaml",
            "seed='${oc.decode:${oc.env:SEED}}'",
            "an interpolation",
        ),
        "hydra choice": ("launch-2/overrides.yaml", "hydra/job_logging=none", "Hydra's own"),
        "hydra setting": (
            "launch-2/overrides.yaml",
            f"hydra.callbacks.pwn={{_target_: numpy.savetxt, fname: {marker}, X: [1]}}",
            "Hydra's own",
        ),
        "key with a newline": ("launch-2/overrides.yaml", "callbacks.a\nb=1", "Hydra reads"),
        "key with a quote": ("launch-2/overrides.yaml", "seed'=1", "Hydra reads"),
        "a long value": ("launch-2/overrides.yaml", "seed=" + "9" * 5000, "longer than"),
        "writes elsewhere": (
            "launch-2/overrides.yaml",
            f"callbacks.model_checkpoint.dirpath={marker.parent}",
            "outside its run folder",
        ),
        "generates tiles elsewhere": (
            "overrides.yaml",
            f"datamodule.source.root={marker}",  # the tiles would go into a folder there
            "generate a tile set in",
        ),
        "config.yaml builds an object": (
            "launch-2/config.yaml",
            "!!python/object/apply:numpy.savetxt [" + str(marker) + ", [1]]",
            "cannot be read as a launch record's config",
        ),
        "config.yaml's frozen key built by resolvers": (
            "launch-2/config.yaml",
            "seed: '${oc.create:{_target_: numpy.savetxt, fname: " + str(marker) + ", X: [1]}}'",
            "seed: the run was started with '${oc.create:",
        ),
    }


ATTACK_NAMES = list(_attacks(Path("/m/marker")))


@pytest.mark.slow
@pytest.mark.parametrize("name", ATTACK_NAMES)
def test_a_resume_runs_no_code_written_into_the_run_folders_records(started_run, tmp_path, name):
    # Someone who can write a copy of the folder edits one of its launch records.
    copy = tmp_path / "copy"
    shutil.copytree(started_run, copy)
    marker = tmp_path / "ran.txt"
    (tmp_path / "evil.yaml").write_text(f"_target_: numpy.savetxt\nfname: {marker}\nX: [1]\n")
    file, text, refusal = _attacks(marker)[name]
    if not file.startswith("launch-2/"):
        shutil.rmtree(copy / ".hydra" / "launch-2")  # .hydra/ is then the latest record
    record = copy / ".hydra" / file
    lines = record.read_text().splitlines()
    if file.endswith("overrides.yaml"):
        record.write_text("\n".join([*lines, f"- {json.dumps(text)}", ""]))
    elif text.startswith("!!"):
        record.write_text(record.read_text().replace("seed: 42", f"seed: {text}"))
    else:
        record.write_text(record.read_text().replace("seed: 42", text))
    before = files(copy)
    ckpt = f"ckpt_path={copy / 'checkpoints' / 'last.ckpt'}"
    refused = launch(tmp_path, ckpt, "trainer.max_epochs=2", OWN_CALLBACK, "model=deeplabv3plus")
    output = refused.stdout + refused.stderr
    assert refused.returncode == 2, output[-3000:]
    assert refusal in output and "Traceback" not in output
    if file.endswith("overrides.yaml"):
        assert f"{record}:{len(lines) + 1}: the recorded override" in output
    assert not marker.exists() and files(copy) == before


@pytest.mark.slow
def test_hydras_own_record_is_never_read_back(started_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(started_run, copy)
    marker = tmp_path / "ran.txt"
    hydra_record = copy / ".hydra" / "launch-2" / "hydra.yaml"
    planted = f"    pwn:\n      _target_: numpy.savetxt\n      fname: {marker}\n      X: [1]\n"
    text = hydra_record.read_text().replace("  callbacks:\n", "  callbacks:\n" + planted, 1)
    hydra_record.write_text(text.replace("env_set: {}", "env_set:\n      PWN: '1'"))
    ckpt = f"ckpt_path={copy / 'checkpoints' / 'last.ckpt'}"
    resumed = launch(tmp_path, ckpt, "trainer.max_epochs=2", OWN_CALLBACK)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not marker.exists()
    assert json.loads((copy / "summary.json").read_text())["epochs"] == 2


@pytest.mark.slow
def test_the_runs_own_callback_is_restored_only_when_given_again(started_run, tmp_path):
    copy = tmp_path / "outputs" / "train" / started_run.name
    shutil.copytree(started_run, copy)
    lines = (copy / ".hydra" / "launch-2" / "overrides.yaml").read_text().splitlines()
    (own_line,) = [n for n, line in enumerate(lines, 1) if OWN_CALLBACK in line]
    untrusted = launch(tmp_path, "ckpt_path=last", "trainer.max_epochs=2")
    assert untrusted.returncode == 2
    recorded = Path("outputs/train") / started_run.name / ".hydra/launch-2/overrides.yaml"
    assert f"{recorded}:{own_line}: the recorded override" in untrusted.stderr
    assert "adds a key" in untrusted.stderr
    resumed = launch(tmp_path, "ckpt_path=last", "trainer.max_epochs=2", OWN_CALLBACK)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((copy / "summary.json").read_text())["epochs"] == 2


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
