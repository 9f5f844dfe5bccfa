import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from segscale.bench import benchmark
from segscale.bench.benchmark import bench, device_counts
from segscale.bench.measure.pipeline import rank_data_rate
from segscale.bench.measure.storage import ROUNDS
from segscale.cli import bench as bench_command
from segscale.cli.bench import EXIT_FAILED_MEASUREMENT, main
from segscale.data.sampling import loaders
from segscale.errors import ConfigError
from segscale.runs.builders import build, build_datamodule
from segscale.training.ranks.threads import Threads, resolve_threads
from tests.conftest import REPO, compose_config, tiny_overrides
from tests.helpers.in_process import run_in_process

MINE = """# @package datamodule
num_classes: 6
class_names: [road, roof, grass, tree, car, other]
class_colors: [[128, 128, 128], [200, 0, 0], [0, 200, 0], [0, 90, 0], [200, 200, 0], [0, 0, 0]]
ignore_index: 255
label_ids: null
ignore_ids: []
"""
"""A user's own classes file (``datamodule/classes=mine``): the synthetic masks' six classes."""
MINE_NAMES = ["road", "roof", "grass", "tree", "car", "other"]


def user_config_folder(folder: Path) -> Path:
    """A config folder of the user's own holding ``datamodule/classes/mine.yaml``."""
    (folder / "datamodule" / "classes").mkdir(parents=True)
    (folder / "datamodule" / "classes" / "mine.yaml").write_text(MINE)
    return folder


QUICK = [
    "bench.seconds=0.1",
    "bench.workers=[1]",
    "bench.warmup_steps=1",
    "bench.window_steps=2",
    "bench.windows=2",
    "bench.options=[channels_last]",
    "bench.option_steps=2",
    "bench.devices=[1,2]",
    "bench.overhead_steps=5",
    "bench.overhead_rounds=2",
]


@pytest.mark.slow
def test_bench_fills_every_section(tiny_data_root: Path, tmp_path: Path):
    run = tmp_path / "bench"
    # bench.py's entry point in this process, whose imports are done (python bench.py
    # would spend ~9 s on them); the runs it measures are processes of their own. The
    # classes are the user's own, in a config folder of theirs: the ddp runs must find
    # it too (they once failed, every one, and bench answered all the same).
    conf = user_config_folder(tmp_path / "myconf")
    overrides = [*tiny_overrides(tiny_data_root, None), *QUICK, f"hydra.run.dir={run}"]
    args = ["--config-dir", str(conf), "datamodule/classes=mine", *overrides]
    done = run_in_process(main, *args, cwd=tmp_path, program="bench.py")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((run / "bench.json").read_text())
    assert results["failed"] == []
    assert " ".join(["--config-dir", str(conf)]) in " ".join(results["config"]["config_options"])

    pipeline = results["pipeline"]
    assert pipeline["loader"]["1"] > 0 and pipeline["crop_only"] > pipeline["crop_and_warp"] > 0
    storage = pipeline["storage"]  # the synthetic PNGs, as training reads them, against memory
    assert storage["stored_as"] == {"decode cache, memory-mapped": 2}
    assert storage["workers"] == 0 and storage["in_memory_tiles"] == 2  # the configured workers
    assert storage["ratio"] == storage["stored_median"] / storage["in_memory_median"] > 0
    assert "as stored / in memory" in done.stdout

    compute = results["compute"]
    assert compute["batch"] == 4 and compute["lightning"]["mean_s"] > 0
    # the one device is a one-device train.py run's: its threads and workers, said
    assert compute["threads"] >= 1 and compute["loader_workers"] == 0
    assert compute["threads_reason"].startswith("training.threads=auto")
    title = f"Compute (one CPU ({results['config']['cpus']} cores), {compute['threads']} thread"
    assert title in done.stdout and "0 loader workers, batch 4" in done.stdout
    duration = results["duration"]
    assert duration["took_s"] > 0 and duration["estimated_s"] > duration["timed_total_s"]
    assert len(compute["lightning"]["window_means_s"]) == 2
    bare = compute["bare"]
    phases = bare["forward_s"] + bare["backward_s"] + bare["optimizer_s"]
    assert phases == pytest.approx(bare["step"]["mean_s"], rel=1e-6)
    assert compute["framework_ratio"] > 0
    network = instantiate(compose_config("train", *tiny_overrides(tiny_data_root, None)).model)
    assert compute["parameters"] == sum(p.numel() for p in network.parameters())
    assert compute["gradient_bytes"] == 4 * compute["parameters"]

    assert [row["option"] for row in results["options"]] == [
        "as configured",
        "training.channels_last=true",
    ]
    assert all(row["error"] is None and row["step_s"] > 0 for row in results["options"])

    measured = results["scaling"]["measured"]
    assert [(row["devices"], row["variant"]) for row in measured] == [
        (1, None),
        (2, None),
        (2, "training.sync_batchnorm=false"),  # on by default: what it costs
    ]
    assert all(row["error"] is None and row["throughput"] > 0 for row in measured), measured
    for row in measured:  # each run composed the user's classes
        composed = (run / Path(row["console"]).parent / ".hydra" / "config.yaml").read_text()
        assert all(name in composed for name in MINE_NAMES), row
    assert measured[0]["speedup"] == 1.0
    assert measured[1]["global_batch"] == 8  # per-device batch 4 on each of 2 ranks

    assert compute["batchnorm_layers"] > 0 and compute["buffer_bytes"] > 0
    assert sum(compute["buckets"]) == compute["gradient_bytes"]
    assert compute["overhead"]["steps"] == 5 and len(compute["overhead"]["rounds_ms"]) == 2
    assert compute["flops"]["flops_per_patch"] > 0 and compute["flops"]["utilisation"] is None

    shared = results["sharing"]
    assert shared["devices"] == 2 and shared["slowdown"] >= 1.0
    assert shared["together"]["sync_points"] == compute["batchnorm_layers"]

    # A CPU's step is no GPU's: no GPU predicted, and the verdict says why
    assert results["prediction"]["rows"] == [] and results["prediction"]["gpu_basis"] is None
    assert "GPUs are not predicted: bench measured CPU" in results["verdict"]
    assert "Scaling, predicted on GPUs: none" in done.stdout
    here = results["prediction"]["this_machine_rows"]
    assert [(row["devices"], row["sync_batchnorm"]) for row in here] == [(2, True), (2, False)]
    assert here[0]["sync_batchnorm_s"] > 0 and here[1]["sync_batchnorm_s"] == 0
    assert all(row["compute_s"] > 0 and row["throughput"] > 0 for row in here)
    assert "This machine: predicted against measured" in done.stdout

    assert "Verdict" in done.stdout and results["verdict"] in done.stdout
    for plot in ("bench_scaling.png", "bench_pipeline.png"):
        assert (run / plot).stat().st_size > 0


def test_device_counts():
    assert device_counts(None, 1) == [1]
    assert device_counts(None, 2) == [1, 2]
    assert device_counts(None, 6) == [1, 2, 4, 6]
    assert device_counts([2, 1, 2], 2) == [1, 2]
    with pytest.raises(ConfigError, match=r"bench\.devices=\[1, 3\].*from 1 to 2"):
        device_counts([1, 3], 2)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("bench.windows=0", "bench.windows=0 is not allowed"),
        ("bench.seconds=-1", "bench.seconds=-1 is not allowed"),
        ("bench.in_memory_gb=0", "bench.in_memory_gb=0 is not allowed"),
        ("bench.predict_devices=[1]", "bench.predict_devices=[1] is not allowed"),
        ("bench.options=[turbo]", "bench.options has ['turbo']"),
        ("bench.threads_per_process=0", "bench.threads_per_process=0 is not allowed"),
        ("trainer.precision=64-true", "trainer.precision='64-true' cannot be measured"),
    ],
)
def test_bad_bench_value_names_the_key(tiny_data_root: Path, tmp_path: Path, override, message):
    cfg = compose_config("bench", *tiny_overrides(tiny_data_root, tmp_path / "run"), override)
    with pytest.raises(ConfigError, match=re.escape(message)):
        bench(cfg, [])
    assert not (tmp_path / "run" / "bench.json").exists()


@pytest.mark.parametrize(
    ("platform", "value", "message"),
    [
        (
            "linux",
            "mpi",
            "strategy.process_group_backend='mpi' is not allowed: not a process-group",
        ),
        (
            "win32",
            "nccl",
            "strategy.process_group_backend='nccl' is not allowed: Windows has no NCCL",
        ),
    ],
)
def test_a_backend_bench_cannot_predict_is_refused_first(
    tiny_data_root: Path, tmp_path: Path, monkeypatch, platform, value, message
):
    overrides = [*tiny_overrides(tiny_data_root, tmp_path / "run"), "strategy=ddp"]
    cfg = compose_config("bench", *overrides, f"strategy.process_group_backend={value}")
    monkeypatch.setattr(sys, "platform", platform)
    with pytest.raises(ConfigError, match=re.escape(message)):
        bench(cfg, [])
    assert not (tmp_path / "run").exists()


def test_each_rank_gets_the_workers_train_py_gives_it(make_config, monkeypatch):
    cfg = make_config()
    effective = build(cfg.scaling).resolve(cfg.datamodule.batch_size, cfg.optimizer.lr, 1)
    datamodule = build_datamodule(cfg, effective)
    datamodule.num_workers = "auto"
    monkeypatch.setattr(loaders, "cpus_available", lambda: 16)
    assert datamodule.workers_per_rank(1) == 8  # MAX_AUTO_WORKERS
    monkeypatch.setattr(loaders, "cpus_available", lambda: 2)
    assert datamodule.workers_per_rank(2) == 1  # one core each: at least one worker
    datamodule.num_workers = 3
    assert datamodule.workers_per_rank(8) == 3  # a configured count is a configured count
    # 2 ranks × (2 workers + their main process) on 4 cores: two thirds of the rate each.
    assert rank_data_rate(300.0, 2, 2, 4) == pytest.approx(200.0)
    assert rank_data_rate(300.0, 1, 2, 4) == 300.0


@pytest.mark.slow
def test_bare_bench_py_composes_its_config_and_picks_its_own_folder(
    tiny_data_root: Path, tmp_path: Path
):
    # A real `python bench.py` process (the suite's one): a fresh process has none of
    # what the tests' process registered (the segscale.run_dir resolver), and a bare
    # bench.py once failed for that while every in-process test passed. No
    # hydra.run.dir: train.yaml's (under bench.yaml) names the folder, in the cwd. A bad
    # bench value then stops bench() at its first check, seconds in (a whole bench, even
    # with QUICK, takes minutes on a busy machine).
    overrides = [*tiny_overrides(tiny_data_root, None), *QUICK, "bench.windows=0"]
    done = subprocess.run(
        [sys.executable, str(REPO / "bench.py"), *overrides],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert "Unsupported interpolation" not in output
    assert done.returncode == 2 and "bench.windows=0 is not allowed" in output, output[-3000:]
    (folder,) = (tmp_path / "outputs" / "bench").iterdir()
    assert "bench.windows=0 is not allowed" in (folder / "bench.log").read_text()


@pytest.mark.parametrize(
    ("folder_option", "failed", "status"),
    [
        ("--config-dir", [{"measurement": "ddp on 2 devices", "error": "exit 1: x"}], 3),
        ("hydra.searchpath", [], 0),
    ],
)
def test_bench_gives_its_runs_its_config_folders_and_fails_with_a_failed_measurement(
    tmp_path: Path, monkeypatch, failed, status, folder_option
):
    # bench() itself stands in: what the command passes it and what it makes of the result.
    conf = user_config_folder(tmp_path / "myconf")
    given = {}

    def measured(cfg, overrides, config):
        given.update(classes=list(cfg.datamodule.class_names), config=config)
        return {"failed": failed}

    monkeypatch.setattr(bench_command, "bench", measured)
    monkeypatch.setattr(bench_command, "finish", lambda results, folder: "the table")
    if folder_option == "--config-dir":
        folders = ["--config-dir", str(conf)]
    else:
        folders = [f"hydra.searchpath=[file://{conf.as_posix()}]"]
    run = tmp_path / "run"
    args = [*folders, "datamodule/classes=mine", f"hydra.run.dir={run}"]
    done = run_in_process(main, *args, cwd=tmp_path, program="bench.py")
    assert done.returncode == status, done.stderr[-2000:]
    assert status in (0, EXIT_FAILED_MEASUREMENT)
    assert given["classes"] == MINE_NAMES
    config = given["config"]  # what the train.py runs get: bench's folders and primary config
    assert " ".join(folders) in " ".join(config)
    assert "--config-name bench" in " ".join(config)
    assert "the table" in done.stdout
    log = (run / "bench.log").read_text()
    assert ("bench could not measure: ddp on 2 devices" in log) == bool(failed)


class MeasuringError(Exception):
    """Raised where bench starts measuring: what it decided before is all a test needs."""


def until_measuring(monkeypatch) -> dict:
    """Stop bench() at its first measurement; what it had set up by then."""
    seen: dict = {}

    def first_measurement(datamodule, workers, seconds, progress):
        seen.update(threads=torch.get_num_threads(), workers=list(workers))
        raise MeasuringError

    monkeypatch.setattr(benchmark, "measure_pipeline", first_measurement)
    return seen


def test_the_one_device_is_timed_with_the_threads_train_py_would_use(
    tiny_data_root: Path, tmp_path: Path, monkeypatch, caplog
):
    # train.py's own decision (resolve_threads) is asked, for one rank and the workers
    # a one-device run gives it; bench computes with its answer.
    asked = []

    def decided(setting, ranks, workers):
        asked.append((setting, ranks, workers))
        return Threads(3, "training.threads=auto: what train.py would take")

    monkeypatch.setattr(benchmark, "resolve_threads", decided)
    seen = until_measuring(monkeypatch)
    overrides = tiny_overrides(tiny_data_root, tmp_path / "run")
    cfg = compose_config("bench", *overrides, "bench.devices=[1,2]", "datamodule.num_workers=2")
    caplog.set_level(logging.INFO, logger="segscale.bench.benchmark")
    before = torch.get_num_threads()
    with pytest.raises(MeasuringError):
        bench(cfg, [])
    assert asked == [("auto", 1, 2)]
    assert seen["threads"] == 3  # not the ddp runs' share (2 cores / 2 devices)
    assert torch.get_num_threads() == before  # given back
    assert "one device, as train.py would run it: threads: 3 per training process" in caplog.text
    # and the real decision, with a number in training.threads: that number
    monkeypatch.setattr(benchmark, "resolve_threads", resolve_threads)
    with pytest.raises(MeasuringError):
        bench(compose_config("bench", *overrides, "training.threads=2"), [])
    assert seen["threads"] == 2


def test_bench_says_how_long_it_will_take_before_measuring(
    tiny_data_root: Path, tmp_path: Path, monkeypatch, caplog
):
    until_measuring(monkeypatch)
    caplog.set_level(logging.INFO, logger="segscale.bench.benchmark")

    def planned(*changes: str) -> str:
        caplog.clear()
        overrides = [*tiny_overrides(tiny_data_root, tmp_path / "run"), "bench.devices=[1,2]"]
        with pytest.raises(MeasuringError):
            bench(compose_config("bench", *overrides, "bench.workers=[1]", *changes), [])
        (line,) = [r.message for r in caplog.records if r.message.startswith("bench will take")]
        return line

    default = planned()
    # 3 one-core rates, 2 worker counts (1 and the configured 0), the storage's rounds,
    # each bench.seconds (2 s); 3 train.py runs of 5 + 3 × 10 steps
    assert f"{3 + 2 + 2 * ROUNDS} data-pipeline rates × bench.seconds=2 s" in default
    assert "3 train.py run(s) × 35 steps, each stopped after bench.timeout_s=1800 s" in default
    assert "bench.seconds=0.5 s" in planned("bench.seconds=0.5")
    assert "× 13 steps" in planned("bench.warmup_steps=3")
    assert "take at most 3.0 min" in planned("bench.timeout_s=60")
    assert planned("bench.devices=[1]") != default  # one train.py run, no side-by-side
