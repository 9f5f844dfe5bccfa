import csv
import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from segscale.cli.train import main
from segscale.errors import ConfigError
from segscale.training.run.training_run import train
from segscale.training.run_folder.resume import resolve_checkpoint
from tests.conftest import tiny_overrides, train_command
from tests.helpers.fake_trainer import fake_trainer, restore
from tests.helpers.in_process import run_in_process

# 3 epochs of 4 iterations; a checkpoint every 3 iterations lands mid-epoch.
RESUMABLE = [
    "trainer.max_epochs=3",
    "callbacks.periodic_checkpoint.frequency=3",
    "callbacks.periodic_checkpoint.unit=iteration",
]
STEPS = 12


def overrides(data_root: Path) -> list[str]:
    tiny = [o for o in tiny_overrides(data_root, Path()) if not o.startswith("output_dir=")]
    return [*tiny, *RESUMABLE]


def run_folder(cwd: Path) -> Path:
    (run,) = (cwd / "outputs" / "train").iterdir()
    return run


@pytest.mark.slow
def test_a_killed_run_resumes_where_it_stopped(tiny_data_root, tmp_path):
    reference_cwd, cwd = tmp_path / "reference", tmp_path / "killed"
    reference_cwd.mkdir()
    cwd.mkdir()
    # The uninterrupted reference, in this process: python train.py's entry point without
    # its 9 s of imports. The run to kill is a process of its own.
    done = run_in_process(main, *overrides(tiny_data_root), cwd=reference_cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = json.loads((run_folder(reference_cwd) / "summary.json").read_text())
    assert reference["steps"] == STEPS

    process = subprocess.Popen(
        train_command(*overrides(tiny_data_root)),
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while not list(cwd.glob("outputs/train/*/checkpoints/epoch*-step*.ckpt")):
        assert process.poll() is None and time.monotonic() < deadline, (
            "no checkpoint before the end"
        )
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)  # a real kill, mid-epoch
    process.wait(timeout=60)
    run = run_folder(cwd)
    assert not (run / "summary.json").exists(), "the run finished before it was killed"
    killed_at = max(int(p.stem.split("step")[1]) for p in (run / "checkpoints").glob("*step*.ckpt"))
    with (run / "metrics.csv").open(newline="") as file:
        before_resume = [row for row in csv.DictReader(file) if int(row["step"]) < killed_at]

    # The resume in this process (python train.py's entry point, without its imports).
    resumed = run_in_process(main, *overrides(tiny_data_root), "ckpt_path=last", cwd=cwd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert run_folder(cwd) == run  # the same run folder, no new one
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == reference["steps"]
    assert summary["epochs"] == reference["epochs"]
    assert summary["final_learning_rate"] == pytest.approx(reference["final_learning_rate"])
    # The schedule continued: after resuming, the rate at each step equals the reference's.
    lr = {}
    for folder, key in ((run, "resumed"), (run_folder(reference_cwd), "reference")):
        rows = (folder / "metrics.csv").read_text().splitlines()
        header = rows[0].split(",")
        for row in rows[1:]:
            cells = dict(zip(header, row.split(","), strict=True))
            if cells.get("lr-SGD"):
                lr.setdefault(key, {})[int(cells["step"])] = float(cells["lr-SGD"])
    assert min(lr["resumed"]) < killed_at  # rows from before the kill were kept
    for step in range(killed_at, STEPS):
        assert lr["resumed"][step] == pytest.approx(lr["reference"][step])
    # metrics.csv holds each step once: the killed launch's rows before its checkpoint are
    # kept as they were, those after it are replaced by the resumed run's.
    with (run / "metrics.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    kinds = Counter(
        ("lr" if r["lr-SGD"] else "val" if r["val/loss"] else "train", int(r["step"])) for r in rows
    )
    assert [key for key, count in kinds.items() if count > 1] == []
    trained = {step for kind, step in kinds if kind == "train"}
    # A kill just after the checkpoint may come before its own step's row is written.
    assert set(range(STEPS)) - trained <= {killed_at - 1}
    assert sorted(step for kind, step in kinds if kind == "val") == [3, 7, 11]
    kept = rows[: len(before_resume)]
    assert [{k: r[k] for k in before_resume[0]} for r in kept] == before_resume


def test_a_resumed_epoch_continues_the_patch_sequence(make_config):
    cfg = make_config("datamodule.patches_per_image=16")
    datamodule = instantiate(cfg.datamodule, _convert_="all")
    datamodule.check()
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    loader.batch_sampler.set_epoch(1)
    uninterrupted = [batch["key"] for batch in loader]
    # Lightning makes the loader before it restores the checkpoint (to count the steps
    # of the schedule) and keeps it; the restored count of batches counts when the epoch starts.
    trainer = fake_trainer()
    datamodule.trainer = trainer
    loader = datamodule.train_dataloader()
    # A run restarting in epoch 1 (8 batches each) after its batch 2: 3 batches done.
    restore(trainer, epoch=1, batches_done=3)
    loader.batch_sampler.set_epoch(1)
    resumed = [batch["key"] for batch in loader]
    assert len(resumed) == 5
    assert all(torch.equal(a, b) for a, b in zip(resumed, uninterrupted[3:], strict=True))


def test_missing_or_corrupt_checkpoints_are_refused(make_config, tmp_path):
    with pytest.raises(ConfigError, match=r"ckpt_path='/no/such\.ckpt': no such file"):
        resolve_checkpoint("/no/such.ckpt", str(tmp_path))
    with pytest.raises(ConfigError, match=r"ckpt_path=last: no checkpoint"):
        resolve_checkpoint("last", str(tmp_path))
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"PK\x03\x04 truncated")
    # A zip archive cut short (an interrupted copy): no complete archive.
    with pytest.raises(
        ConfigError, match=r"ckpt_path='.*corrupt\.ckpt' is not a checkpoint, or a trunc"
    ):
        train(make_config(f"ckpt_path={corrupt}"))
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before training
