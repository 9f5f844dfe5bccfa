"""Every epoch trains all its full batches and validates: with gradient accumulation, and
when the patches leave a last, partial batch (it is left out, as MATLAB's trainNetwork does).

Counted from what a real run trains (``RecordBatches``): per epoch, its batches, patches
and optimizer steps, and the validations.
"""

from collections import Counter
from pathlib import Path

import pytest

from segscale.cli.train import main
from segscale.training.run.training_run import train
from tests.conftest import tiny_overrides
from tests.helpers.in_process import run_in_process
from tests.helpers.record_batches import recorded

FAST = [
    "callbacks.validation_report=null",
    "callbacks.training_progress=null",
    "+callbacks.record._target_=tests.helpers.record_batches.RecordBatches",
    "datamodule.shuffle=every-epoch",  # each epoch its own patches, so none repeats
    "datamodule.patch_size=32",
]


def trained(make_config, run: Path, *overrides: str) -> tuple[dict, list[dict], list[dict]]:
    """The summary, the recorded batches and the recorded validations of one run."""
    record = f"+callbacks.record.folder={run}/record"
    summary = train(make_config(*FAST, record, f"output_dir={run}", *overrides))
    return (summary, *recorded(run / "record"))


@pytest.mark.slow
def test_accumulated_epochs_train_every_batch_and_validate(make_config, tmp_path):
    # 2 tiles × 5 patches in batches of 2: 5 batches an epoch, in 3 optimizer steps (the
    # last, a window of one batch). Epoch 1 used to start 5 / 2 steps in and skip one.
    summary, batches, validations = trained(
        make_config,
        tmp_path / "run",
        "datamodule.patches_per_image=5",
        "datamodule.batch_size=2",
        "trainer.accumulate_grad_batches=2",
        "trainer.max_epochs=2",
        # An epoch of warm-up and a drop every epoch, in epochs of 3 optimizer steps.
        "scheduler=piecewise",
        "scheduler.drop_period=1",
        "scheduler.drop_factor=0.1",
        "scheduler.warmup_epochs=1",
        "scheduler.warmup_start_factor=0.4",
    )
    assert Counter(b["epoch"] for b in batches) == {0: 5, 1: 5}
    assert [b["batch"] for b in batches] == [0, 1, 2, 3, 4] * 2
    # Each epoch draws its own patches (datamodule.shuffle=every-epoch).
    assert all(key[0] == b["epoch"] for b in batches for key in b["keys"])
    patches = [tuple(k) for b in batches for k in b["keys"]]
    assert len(patches) == len(set(patches)) == 20  # every patch of every epoch, once
    steps = [b["step"] for b in batches]
    assert steps == [0, 1, 1, 2, 3, 3, 4, 4, 5, 6]  # the global step after each batch
    assert [(v["validated"], v["step"]) for v in validations] == [(0, 3), (1, 6)]
    assert summary["steps"] == 6 and summary["epochs"] == 2
    # The schedule counts epochs of ceil(5 / 2) = 3 steps: the warm-up ends and the rate
    # drops at step 3, the first of epoch 1, and drops again at step 6.
    warmed = {0: 0.4, 1: 0.6, 2: 0.8}
    expected = [warmed.get(step, 1.0) * 0.1 ** (step // 3) for step in steps]
    assert [b["lr_factor"] for b in batches] == pytest.approx(expected)


def test_a_last_partial_batch_is_left_out(make_config, tmp_path):
    # 2 tiles × 5 patches in batches of 3: 3 full batches and 1 patch left over, which
    # as a batch of its own stopped DeepLabV3+'s batch norm with a traceback.
    summary, batches, validations = trained(
        make_config,
        tmp_path / "run",
        "datamodule.patches_per_image=5",
        "datamodule.batch_size=3",
        "trainer.max_epochs=1",
    )
    assert [len(b["keys"]) for b in batches] == [3, 3, 3]
    assert summary["steps"] == 3 and len(validations) == 1


def test_an_epoch_without_a_full_batch_is_refused(tiny_data_root, tmp_path):
    done = run_in_process(
        main,
        *tiny_overrides(tiny_data_root, tmp_path / "run"),
        "datamodule.patches_per_image=1",
        "datamodule.batch_size=4",
        cwd=tmp_path,  # Hydra's run folder, which the refusal leaves, is under the cwd
    )
    output = done.stdout + done.stderr  # the log's ERROR line
    assert done.returncode == 2, output[-3000:]
    assert "an epoch of 2 training patches (datamodule.patches_per_image=1 × 2 images) " in output
    assert "holds no full global batch of 4 (datamodule.batch_size × devices)" in output
    assert "Traceback" not in output
