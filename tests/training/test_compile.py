"""``training.compile=true`` trains as eager does: the same loss at every step.

The CPU counterpart of the GPU tier's check (tests/gpu/test_gpu_tier.py): torch.compile
must change how fast a step runs, never what it computes.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from tests.conftest import compose_config, tiny_overrides

from segscale.training.run import train


def train_losses(run: Path) -> dict[int, float]:
    """The training loss of every logged step in ``run``'s metrics.csv."""
    with (run / "metrics.csv").open(newline="") as file:
        return {
            int(row["step"]): float(row["train/loss"])
            for row in csv.DictReader(file)
            if row.get("train/loss")
        }


@pytest.mark.slow
def test_compile_trains_as_eager_does(tiny_data_root, tmp_path):
    common = [
        "trainer.max_epochs=1",
        "trainer.log_every_n_steps=1",
        "trainer.limit_val_batches=0",
        "callbacks=none",
    ]
    runs = {}
    for name, extra in (("eager", []), ("compiled", ["training.compile=true"])):
        run = tmp_path / name
        overrides = [*tiny_overrides(tiny_data_root, run), *common, *extra]
        summary = train(compose_config("train", *overrides))
        assert summary["status"] == "finished", name
        runs[name] = train_losses(run)
    eager, compiled = runs["eager"], runs["compiled"]
    assert sorted(eager) == sorted(compiled) == list(range(4))
    for step, loss in eager.items():
        assert compiled[step] == pytest.approx(loss, rel=1e-4), f"step {step}"
