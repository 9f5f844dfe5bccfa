"""Training with spawned DataLoader workers (``datamodule.worker_start_method=spawn``).

Spawn is how Windows and macOS start workers: each imports segscale afresh and receives
its dataset pickled (the decode cache's mapped tiles by path). Spawned ``ddp_spawn``
ranks start spawned workers of their own.
"""

from pathlib import Path

import pytest

from segscale.training.run.training_run import train
from tests.helpers.record_start_method import record_start_method, recorded_start_methods

pytestmark = [pytest.mark.slow, pytest.mark.spawn]


def test_a_run_trains_with_spawned_workers(make_config, tmp_path: Path):
    summary = train(
        make_config(
            "datamodule.num_workers=2",
            "datamodule.worker_start_method=spawn",
            "trainer.max_epochs=1",
            *record_start_method(tmp_path / "start"),
        )
    )
    assert summary["steps"] == 4 and Path(summary["last_checkpoint"]).is_file()
    assert recorded_start_methods(tmp_path / "start") == {
        "rank0": {"method": "spawn", "workers": ["SpawnProcess", "SpawnProcess"]}
    }


def test_ddp_spawn_ranks_train_with_spawned_workers(make_config, tmp_path: Path):
    summary = train(
        make_config(
            "strategy=ddp_spawn",
            "trainer.devices=2",
            "datamodule.num_workers=1",
            "datamodule.worker_start_method=spawn",
            "trainer.max_epochs=1",
            *record_start_method(tmp_path / "start"),
        )
    )
    assert summary["world_size"] == 2 and summary["steps"] == 2
    assert Path(summary["last_checkpoint"]).is_file()
    spawned = {"method": "spawn", "workers": ["SpawnProcess"]}
    assert recorded_start_methods(tmp_path / "start") == {"rank0": spawned, "rank1": spawned}
