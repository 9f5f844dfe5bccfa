"""A run resumed mid-epoch with DataLoader workers trains the patches the uninterrupted run
trains, batch for batch, on one process and under DDP (a loader with workers asks its
sampler for batches as soon as its iterator is made, and Lightning makes the training
loader's iterator before it restores the checkpoint's step).

Each run resumes a copy of an uninterrupted run's folder from its checkpoint in epoch 1;
``RecordBatches`` records what each run trains.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

from segscale.cli.train import main
from tests.conftest import tiny_overrides, train_command
from tests.helpers.in_process import run_in_process
from tests.helpers.record_batches import recorded

# 2 epochs of 4 steps (tiny_overrides' 2 tiles × 8 patches, global batches of 4), a
# checkpoint every 3 steps: the one at step 6 is in epoch 1, after 2 of its batches.
RESUMABLE = [
    "trainer.max_epochs=2",
    "callbacks.periodic_checkpoint.frequency=3",
    "callbacks.periodic_checkpoint.unit=iteration",
    "callbacks.validation_report=null",
    "callbacks.training_progress=null",
    "+callbacks.record._target_=tests.helpers.record_batches.RecordBatches",
]
RESUME_STEP = 6
DDP = ["strategy=ddp", "trainer.devices=2", "datamodule.batch_size=2", "training.threads=1"]


def train(data_root: Path, cwd: Path, *overrides: str, own_process: bool = False) -> None:
    """Train in ``cwd`` (in this process unless ``own_process``: DDP's rank 1 needs one)."""
    args = [*tiny_overrides(data_root, None), *RESUMABLE, *overrides]
    if own_process:
        done = subprocess.run(
            train_command(*args), cwd=cwd, capture_output=True, text=True, timeout=600
        )
    else:
        done = run_in_process(main, *args, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]


def resume_copy(data_root: Path, reference: Path, cwd: Path, *overrides: str, **how) -> None:
    """Resume a copy of ``reference``'s run from its checkpoint at ``RESUME_STEP``."""
    shutil.copytree(reference / "run", cwd / "run")
    (checkpoint,) = (cwd / "run").glob(f"checkpoints/epoch*-step{RESUME_STEP:07d}.ckpt")
    train(
        data_root,
        cwd,
        f"ckpt_path={checkpoint}",
        f"+callbacks.record.folder={cwd}/record",
        *overrides,
        **how,
    )


def batches(record: Path, rank: int = 0) -> list[tuple[int, int, list[list[int]]]]:
    """``(epoch, batch, keys)`` of each batch ``rank`` trained."""
    return [(b["epoch"], b["batch"], b["keys"]) for b in recorded(record, rank)[0]]


@pytest.fixture(scope="module")
def reference(tiny_data_root, tmp_path_factory) -> Path:
    """An uninterrupted run without workers: its folder ``run`` and its records ``record``."""
    cwd = tmp_path_factory.mktemp("reference")
    train(tiny_data_root, cwd, f"hydra.run.dir={cwd}/run", f"+callbacks.record.folder={cwd}/record")
    return cwd


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers",
    [
        ["datamodule.num_workers=1", "datamodule.persistent_workers=false"],
        ["datamodule.num_workers=2", "datamodule.persistent_workers=true"],
    ],
    ids=["1-worker", "2-persistent-workers"],
)
def test_a_resume_with_workers_trains_the_uninterrupted_runs_patches(
    tiny_data_root, tmp_path, reference, workers
):
    resume_copy(tiny_data_root, reference, tmp_path, *workers)
    uninterrupted = batches(reference / "record")
    assert len(uninterrupted) == 8
    assert batches(tmp_path / "record") == uninterrupted[RESUME_STEP:]


@pytest.mark.slow
def test_a_ddp_resume_with_workers_trains_the_uninterrupted_runs_patches(
    tiny_data_root, tmp_path, reference
):
    ddp_reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    ddp_reference.mkdir()
    resumed.mkdir()
    train(
        tiny_data_root,
        ddp_reference,
        *DDP,
        f"hydra.run.dir={ddp_reference}/run",
        f"+callbacks.record.folder={ddp_reference}/record",
        own_process=True,
    )
    resume_copy(
        tiny_data_root, ddp_reference, resumed, *DDP, "datamodule.num_workers=1", own_process=True
    )
    one_process = batches(reference / "record")
    for rank in (0, 1):
        uninterrupted = batches(ddp_reference / "record", rank)
        # Rank r's batch of each step is its slice of the one-process batch.
        assert [keys for *_, keys in uninterrupted] == [
            keys[2 * rank : 2 * rank + 2] for *_, keys in one_process
        ]
        assert batches(resumed / "record", rank) == uninterrupted[RESUME_STEP:]
