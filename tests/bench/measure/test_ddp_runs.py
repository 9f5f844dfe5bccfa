import sys
from pathlib import Path

import hydra
import psutil
import pytest

from segscale.bench.measure import ddp_runs
from segscale.bench.measure.ddp_runs import (
    HYDRA_HINT,
    ScalingPoint,
    first_error,
    measure_scaling,
    passed_on,
    run_error,
    run_scaling_point,
    scaling_command,
    without_key,
)
from segscale.bench.measure.timing import summarize_steps
from segscale.progress import Progress
from tests.conftest import compose_config, tiny_overrides
from tests.helpers.in_process import run_in_process

THEIR_CONFIG = ["--config-dir", "/their/conf", "hydra.searchpath=[file:///their/more]"]


def test_the_users_overrides_are_passed_on_except_what_the_runs_set():
    overrides = [
        "datamodule.batch_size=16",
        "model.encoder=resnet50",
        "trainer.precision=bf16-mixed",
        "trainer.devices=4",
        "strategy=ddp_spawn",
        "training.sync_batchnorm=false",
        "callbacks=default",
        "+callbacks.extra._target_=x.Y",
        "hydra.run.dir=/somewhere",
        "bench.seconds=1",
        "trainer.max_epochs=3",
    ]
    assert passed_on(overrides) == [
        "datamodule.batch_size=16",
        "model.encoder=resnet50",
        "trainer.precision=bf16-mixed",
        "training.sync_batchnorm=false",
    ]


def test_scaling_command_runs_train_py_with_ddp_and_a_step_timer(tmp_path: Path):
    command = scaling_command(["model.encoder=resnet50"], 2, "cpu", 35, tmp_path / "n2", [])
    # train.py as a module, found wherever segscale is installed
    assert command[1:4] == ["-m", "segscale.cli.train", "model.encoder=resnet50"]
    for expected in (
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "++trainer.max_steps=35",
        "++trainer.limit_val_batches=0",
        "+callbacks.step_timer._target_=segscale.bench.measure.timing.StepTimer",
        f"+callbacks.step_timer.path={tmp_path / 'n2' / 'steps.json'}",
        f"hydra.run.dir={tmp_path / 'n2'}",
    ):
        assert expected in command


def test_scaling_command_loads_the_config_folders_bench_loaded(tmp_path: Path):
    command = scaling_command(["datamodule/classes=mine"], 2, "cpu", 35, tmp_path, THEIR_CONFIG)
    # before the overrides, as --config-dir must be
    assert command[3:7] == [*THEIR_CONFIG, "datamodule/classes=mine"]


def test_without_key_drops_every_override_of_the_key():
    assert without_key(["a=1", "training.sync_batchnorm=false"], "training.sync_batchnorm") == [
        "a=1"
    ]


def test_each_scaling_run_gets_the_config_options_and_the_composed_sync_batchnorm(
    tiny_data_root: Path, tmp_path: Path, monkeypatch
):
    # Synchronized batch norm off in the composed config but in no override (a user's
    # preset, say): the variant run turns it on, and the runs are said to have it off.
    cfg = compose_config(
        "bench",
        *tiny_overrides(tiny_data_root, tmp_path),
        "training.sync_batchnorm=false",
        "bench.warmup_steps=0",
        "bench.window_steps=2",
        "bench.windows=1",
    )
    commands: list[list[str]] = []

    def run(command, folder, devices, *_):
        commands.append(command)
        if devices == 2:
            return ScalingPoint(devices, None, 0, "exit 1: In 'x': Could not find 'y'")
        return ScalingPoint(devices, summarize_steps([0.1, 0.1], 0, 1), 4)

    monkeypatch.setattr(ddp_runs, "run_scaling_point", run)
    monkeypatch.setattr(ddp_runs, "measure_allreduce", lambda *_: None)
    compute = {"gradient_bytes": 1000}
    progress = Progress(3, "bench", None)
    measured, _ = measure_scaling(cfg, [], THEIR_CONFIG, [1, 2], 1, compute, progress)
    progress.close()
    assert all(command[3:6] == THEIR_CONFIG for command in commands)
    assert measured["sync_batchnorm"] is False
    assert "training.sync_batchnorm=true" in commands[-1]
    rows = measured["measured"]
    assert [(r["devices"], r["variant"], r["error"] is None) for r in rows] == [
        (1, None, True),
        (2, None, False),
        (2, "training.sync_batchnorm=true", False),
    ]
    assert rows[1]["console"] == "scaling/devices_2/console.log"
    assert rows[1]["speedup"] is None and rows[0]["speedup"] == 1.0


REPLAY = "import sys; sys.stdout.write(open(sys.argv[1]).read()); sys.exit(int(sys.argv[2]))"
"""A process that writes a file's text as its output and exits with the status given."""


def test_a_run_that_fails_is_the_first_error_its_output_names(tmp_path: Path):
    # Hydra's own words for a config that does not compose, as the scaling runs met them
    # with the user's classes file in a config folder they were not given: a Hydra
    # program run here (a process would spend seconds discovering Hydra's plugins), its
    # output written by a process that exits as Hydra's does.
    (tmp_path / "conf" / "classes").mkdir(parents=True)
    (tmp_path / "conf" / "config.yaml").write_text("defaults:\n  - classes: theirs\n")
    (tmp_path / "conf" / "classes" / "theirs.yaml").write_text("num_classes: 2\n")
    app = hydra.main(version_base="1.3", config_path=str(tmp_path / "conf"), config_name="config")
    done = run_in_process(app(lambda cfg: None), "classes=mine", cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.rstrip().splitlines()[-1].startswith(HYDRA_HINT)
    (tmp_path / "hydra.txt").write_text(done.stderr)
    command = [sys.executable, "-c", REPLAY, str(tmp_path / "hydra.txt"), "1"]
    point = run_scaling_point(command, tmp_path / "run", 1, 1, 0, 1, timeout_s=60)
    assert point.timing is None and point.throughput is None
    assert point.error == "exit 1: In 'config': Could not find 'classes/mine'"
    assert (tmp_path / "run" / "console.log").read_text() == done.stderr


RANK_STARTER = """
import subprocess, sys, time
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # holds no pipe of ours
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], **quiet)
print("step 1", rank.pid, flush=True)
time.sleep(60)
"""


def test_a_run_past_its_time_is_stopped_with_the_ranks_it_started_and_its_output_kept(
    tmp_path: Path,
):
    # As train.py's rank 0 starts the other ranks: they end with it, none is left running.
    command = [sys.executable, "-c", RANK_STARTER]
    point = run_scaling_point(command, tmp_path, 1, 1, 0, 1, timeout_s=4)
    assert point.error == "no result within 4 s" and point.timing is None
    said, pid = (tmp_path / "console.log").read_text().strip().rsplit(" ", 1)
    assert said == "step 1"
    try:
        rank = psutil.Process(int(pid))
    except psutil.NoSuchProcess:
        return
    left = rank.status() != psutil.STATUS_ZOMBIE
    rank.kill()
    assert not left, "the rank the run started was left running"


def test_a_run_that_ends_without_a_step_timing_says_so():
    assert run_error(0, "ran\n") == "exit 0: it wrote no step timing (steps.json)"
    assert run_error(-9, "") == "killed by signal 9: no output"
    assert run_error(1, "step 3\nsomething odd\n") == "exit 1: something odd"


@pytest.mark.slow
def test_this_machines_allreduce_is_a_curve_through_measured_points():
    from segscale.bench.measure.ddp_runs import ALLREDUCE_SIZES, measure_allreduce

    link = measure_allreduce(2, 2 * 2**20, cuda=False, repeats=2)
    # 4 B, 4 KiB, 64 KiB, 1 MiB and 2 MiB: ring bytes over 2 ranks are the bytes.
    assert [x for x, _ in link.points] == [*ALLREDUCE_SIZES, 2 * 2**20]
    times = [t for _, t in link.points]
    assert times == sorted(times) and times[0] > 0
    assert link.allreduce_time(2 * 2**20, 2) == times[-1]


class _JoinedError(Exception):
    """Raised in place of joining a process group: the rank stops there."""


@pytest.mark.parametrize(
    ("platform", "cuda", "backend"),
    [
        ("linux", True, "nccl"),
        ("linux", False, "gloo"),
        ("win32", True, "gloo"),  # Windows' GPUs: no NCCL there
        ("darwin", False, "gloo"),
    ],
)
def test_the_allreduce_ranks_join_the_platforms_backend(platform, cuda, backend, monkeypatch):
    joined = []

    def join(name: str, **kwargs: object) -> None:
        joined.append(name)
        raise _JoinedError

    monkeypatch.setattr(ddp_runs.dist, "init_process_group", join)
    monkeypatch.setattr(ddp_runs.torch.cuda, "set_device", lambda device: None)
    for variable in ("MASTER_ADDR", "MASTER_PORT"):  # the rank sets them: restored after
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(sys, "platform", platform)
    with pytest.raises(_JoinedError):
        ddp_runs._allreduce_rank(0, 2, 29500, 4, 1, "unused.json", cuda)
    assert joined == [backend]


HINT = "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."
INFO = "[2026-12-01 22:22:17,212][segscale.cli.train][INFO] - {}"
ERROR = "[2026-12-01 22:22:19,001][segscale.cli.train][ERROR] - {}"
WARNED = "/site/lightning/trainer.py:12: UserWarning: something\n  warnings.warn(message)"


@pytest.mark.parametrize(
    ("console", "expected"),
    [
        # Hydra cannot compose the config: its message, not its last line
        (
            "In 'datamodule/synthetic': Could not find 'datamodule/classes/mine'\n\n"
            "Available options in 'datamodule/classes':\n\tauto\n\tbinary\n"
            "Config search path:\n\tprovider=hydra, path=pkg://hydra.conf\n"
            f"\tprovider=schema, path=structured://\n\n{HINT}\n",
            "In 'datamodule/synthetic': Could not find 'datamodule/classes/mine'",
        ),
        # ... after import-time warnings
        (
            f"{WARNED}\nCould not override 'x'.\nKey 'x' is not in struct\n{HINT}\n",
            "Could not override 'x'.",
        ),
        # segscale's refusal, logged: the first ERROR record, not what follows it
        (
            "\n".join(
                [
                    INFO.format("run folder /runs/a"),
                    ERROR.format("datamodule.patch_size=999 is larger than the images"),
                    ERROR.format("rank 1 failed"),
                ]
            ),
            "datamodule.patch_size=999 is larger than the images",
        ),
        # a crash: the line that names the exception ends the first traceback
        (
            "\n".join(
                [
                    INFO.format("Traceback (most recent call last): quoted in a message"),
                    "Error executing job with overrides: ['a=1']",
                    "Traceback (most recent call last):",
                    '  File "/x/train.py", line 3, in run',
                    "    fit()",
                    "    ^^^^^",
                    "RuntimeError: DataLoader worker (pid 4711) is killed by signal",
                    "",
                    "During handling of the above exception, another exception occurred:",
                    "",
                    "Traceback (most recent call last):",
                    "ValueError: the second",
                    "",
                    HINT,
                ]
            ),
            "RuntimeError: DataLoader worker (pid 4711) is killed by signal",
        ),
        # refused before Hydra starts
        (
            "Error: strategy.sync_batchnorm moved: use training.sync_batchnorm\n",
            "strategy.sync_batchnorm moved: use training.sync_batchnorm",
        ),
        # log records, then Hydra's message (an error it reports without a traceback)
        (
            f"{INFO.format('building')}\n{INFO.format('Error: not this one')}\n"
            f"Error locating target 'x.Y'\n{HINT}\n",
            "Error locating target 'x.Y'",
        ),
    ],
)
def test_the_first_error_in_the_words_the_run_gave(console, expected):
    assert first_error(console) == expected


@pytest.mark.parametrize(
    "console",
    [
        "",
        f"{INFO.format('step 3')}\n{WARNED}\n",  # no error named: the caller says what it saw
        f"{INFO.format('Error: in an INFO record')}\n  Error: indented\n",
        f"{INFO.format('step 3')}\n\n{HINT}\n",  # Hydra's advice is no error
    ],
)
def test_output_that_names_no_error_gives_none(console):
    assert first_error(console) is None
