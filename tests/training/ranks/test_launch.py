import importlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import ClassVar

import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from segscale.command_line import config_options
from segscale.configs import compose_config
from segscale.errors import ConfigError
from segscale.training.ranks import launch
from segscale.training.ranks.launch import (
    job_ranks,
    must_start_ranks,
    rank_command,
    single_device_strategy,
    warn_if_restarts_may_hang,
)


def test_ranks_are_started_only_by_the_launching_process(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert must_start_ranks("popen", 2)
    assert not must_start_ranks("popen", 1)
    assert not must_start_ranks("spawn", 2)
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")  # one task in an allocation: start the ranks
    assert must_start_ranks("popen", 2)
    monkeypatch.setenv("SLURM_NTASKS", "8")  # srun started one task per device
    assert not must_start_ranks("popen", 2)
    monkeypatch.delenv("SLURM_LOCALID")
    monkeypatch.setenv("LOCAL_RANK", "0")  # torchrun, or a rank we started
    assert not must_start_ranks("popen", 2)


def test_rank_command_carries_the_jobs_own_overrides(monkeypatch):
    hydra_cfg = OmegaConf.create(
        {"hydra": {"overrides": {"task": ["optimizer.lr=0.03", "trainer.devices=[0,2]"]}}}
    )
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hydra_cfg.hydra))
    command = rank_command(1, "/runs/it's here")
    assert "optimizer.lr=0.03" in command and "trainer.devices=[0,2]" in command
    assert 'hydra.run.dir="/runs/it\'s here"' in command
    assert "hydra.output_subdir=null" in command and "hydra/job_logging=none" in command
    assert "-m" not in command[2:] and "--multirun" not in command


def test_windows_paths_reach_the_ranks_unchanged(monkeypatch):
    # As the user typed them (unquoted or quoted), and as rank 0 resolved them.
    typed = {
        "datamodule.source.root": r"C:\Users\me\data",
        "datamodule.decode_cache.folder": r"'\\server\share\x'",
    }
    resolved = {"ckpt_path": r"D:\tiles\runs\a b,c=$1\checkpoints\last.ckpt"}
    tasks = [f"{key}={value}" for key, value in typed.items()]
    hydra_cfg = OmegaConf.create({"hydra": {"overrides": {"task": tasks}}})
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hydra_cfg.hydra))
    command = rank_command(1, r"\\server\share\x\run 1", resolved)
    overrides = command[command.index(tasks[0]) :]
    cfg = compose_config("train", overrides, return_hydra_config=True)
    assert cfg.datamodule.source.root == r"C:\Users\me\data"
    assert cfg.datamodule.decode_cache.folder == r"\\server\share\x"
    assert cfg.ckpt_path == resolved["ckpt_path"]
    assert cfg.hydra.run.dir == r"\\server\share\x\run 1"


def test_multi_node_ranks_are_not_started_from_one_node(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    refused = pytest.raises(ConfigError, match=r"trainer\.num_nodes=2.*torchrun")
    with refused, job_ranks("popen", 1, "/tmp/run", num_nodes=2):
        pass


def test_other_ranks_get_rank_zeros_resolved_values(monkeypatch):
    tasks = ["ckpt_path=last", "optimizer.lr=0.1"]
    hydra_cfg = OmegaConf.create({"hydra": {"overrides": {"task": tasks}}})
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hydra_cfg.hydra))
    command = rank_command(1, "/runs/a", {"ckpt_path": "/runs/a/checkpoints/last.ckpt"})
    assert "ckpt_path=last" not in command
    assert "ckpt_path='/runs/a/checkpoints/last.ckpt'" in command
    assert "optimizer.lr=0.1" in command


@pytest.mark.slow
def test_a_failing_rank_ends_the_whole_run_quickly(tiny_data_root, tmp_path):
    from tests.conftest import tiny_overrides, train_command

    overrides = [o for o in tiny_overrides(tiny_data_root, tmp_path) if "output_dir" not in o]
    started = time.monotonic()
    result = subprocess.run(
        train_command(
            "strategy=ddp",
            "trainer.devices=2",
            *overrides,
            f"hydra.run.dir={tmp_path / 'run'}",
            "+callbacks.fail._target_=tests.helpers.failing.FailOnRank",
            "+callbacks.fail.rank=1",
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=tree_environment(),
    )
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert "injected failure on rank 1" in result.stderr  # the failing rank's own error
    assert "rank 1 failed with exit code 1" in result.stderr  # and rank 0 names it last
    assert elapsed < 60
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed"  # rank 0 stopped in a collective, and says so


def tree_environment() -> dict[str, str]:
    """This environment with the repository first on ``PYTHONPATH``, the caller's kept after.

    The repository holds ``tests.helpers.failing``; ``segscale`` is then the tree under
    test that the caller's ``PYTHONPATH`` names, not the one installed in the environment.
    """
    from tests.conftest import REPO

    callers = os.environ.get("PYTHONPATH", "")
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), callers]))}


def test_the_started_train_py_imports_the_segscale_under_test(tmp_path):
    import segscale

    imported = subprocess.run(
        [sys.executable, "-c", "import segscale; print(segscale.__file__)"],
        env=tree_environment(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert imported == segscale.__file__


def test_ranks_load_the_jobs_own_config_folders(monkeypatch):
    sources = [
        {"path": "hydra.conf", "schema": "pkg", "provider": "hydra"},
        {"path": "/site/segscale/conf", "schema": "file", "provider": "main"},
        {"path": "/their/conf", "schema": "file", "provider": "command-line"},
        {"path": "/their/more", "schema": "file", "provider": "hydra.searchpath in command-line"},
        {"path": "", "schema": "structured", "provider": "schema"},
    ]
    hydra_overrides = ["hydra.searchpath=[file:///their/more]", "hydra.mode=MULTIRUN"]
    hydra_cfg = OmegaConf.create(
        {
            "hydra": {
                "overrides": {"task": ["experiment=mine"], "hydra": hydra_overrides},
                "job": {"config_name": "mytrain"},
                "runtime": {"config_sources": sources},
            }
        }
    )
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hydra_cfg.hydra))
    command = rank_command(1, "/runs/a")
    options = command[command.index("--config-path") : command.index("experiment=mine")]
    assert options == [
        *("--config-path", "/site/segscale/conf"),
        *("--config-dir", "/their/conf"),
        *("--config-name", "mytrain"),
        "hydra.searchpath=[file:///their/more]",
    ]
    assert "hydra.mode=MULTIRUN" not in command  # only the job's own config folders
    hydra_cfg.hydra.runtime.config_sources[1] = {
        "path": "theirs.conf",
        "schema": "pkg",
        "provider": "main",
    }
    assert config_options(hydra_cfg.hydra)[:2] == ["--config-path", "pkg://theirs.conf"]


class FakeRanks:
    """Stands in for ``RankProcesses``: keeps what the ranks would get, starts nothing."""

    envs: ClassVar[list[dict[str, str]]] = []

    def __init__(self, commands: list[list[str]], envs: list[dict[str, str]], cwd: str) -> None:
        FakeRanks.envs = envs

    def wait(self) -> None:
        pass

    def failures(self) -> list[tuple[int, int]]:
        return []

    def terminate(self) -> None:
        pass


@pytest.fixture
def fake_ranks(monkeypatch):
    from segscale.training.ranks import launch

    for variable in ("LOCAL_RANK", "SLURM_LOCALID", "OMP_NUM_THREADS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(launch, "RankProcesses", FakeRanks)
    monkeypatch.setattr(launch, "rank_command", lambda rank, folder, resolved=None: ["train.py"])
    yield FakeRanks


def test_ranks_inherit_the_threads_this_process_sets(fake_ranks, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # as process_threads sets it
    with job_ranks("popen", 3, "/runs/a"):
        assert os.environ["LOCAL_RANK"] == "0"
    assert [env["OMP_NUM_THREADS"] for env in fake_ranks.envs] == ["2", "2"]
    assert "LOCAL_RANK" not in os.environ  # the environment as it was


def test_torchrun_restarts_through_a_shared_store_are_warned_of(monkeypatch, caplog):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    warn_if_restarts_may_hang()
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in caplog.text
    caplog.clear()
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    warn_if_restarts_may_hang()
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    warn_if_restarts_may_hang()
    assert caplog.text == ""


def test_a_failed_rank_ends_the_others_and_then_this_process(monkeypatch, tmp_path):
    # Rank 0 stuck in a collective with a rank that died notices nothing: the watchdog
    # stops the other ranks and ends rank 0 (segscale.platforms.processes: SIGKILL here,
    # TerminateProcess on Windows, for real in tests/platforms/test_processes.py).
    ended = threading.Event()
    monkeypatch.setattr(launch, "GRACE_S", 0.1)
    monkeypatch.setattr(launch, "end_this_process", ended.set)
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    waiting = [sys.executable, "-c", "import time; time.sleep(60)"]
    ranks = launch.RankProcesses([failing, waiting], [dict(os.environ)] * 2, str(tmp_path))
    try:
        assert ended.wait(timeout=30), "rank 0 was not ended"
        assert ranks.processes[0].returncode == 3
        assert ranks.processes[1].poll() is not None, "the other rank was left running"
    finally:
        ranks.terminate()


def test_on_windows_the_ranks_store_is_the_one_without_libuv(monkeypatch):
    # What job_ranks leaves to torch (its comment): Windows builds have no libuv, and
    # init_process_group's env:// store takes it there only if USE_LIBUV=1 asks for it.
    # torch.distributed's own name "rendezvous" is the function: the module by its path
    rendezvous = importlib.import_module("torch.distributed.rendezvous")
    monkeypatch.delenv("USE_LIBUV", raising=False)
    monkeypatch.setattr(sys, "platform", "win32")
    assert not rendezvous._get_use_libuv_from_query_dict({})
    monkeypatch.setattr(sys, "platform", "linux")
    assert rendezvous._get_use_libuv_from_query_dict({})  # elsewhere libuv, the default


def test_single_device_strategy_refuses_several_devices():
    assert single_device_strategy("cpu", 1).root_device == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"trainer\.devices=2.*use strategy=ddp"):
        single_device_strategy("cpu", 2)
    with pytest.raises(ConfigError, match=r"trainer\.devices=\[0, 1\].*use strategy=ddp"):
        single_device_strategy("cpu", OmegaConf.create([0, 1]))
