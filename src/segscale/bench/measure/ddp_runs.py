"""Measured scaling: ``train.py`` with ``strategy=ddp`` on N devices, and the all-reduce.

Each N is a real, short training run through the same entry point as the user's
(``python train.py <bench's config folders> <the user's overrides> strategy=ddp
trainer.devices=N``), with the data pipeline, DDP, synchronized batch norm and all; the
config folders are those bench's own run loaded (``--config-dir``, ``hydra.searchpath``,
its primary config: ``segscale.command_line.config_options``), so that a run finds the
user's own config files as bench did. Validation, checkpoints and loggers
are off, and a ``StepTimer`` callback records rank 0's step times. On CPUs every rank
gets the same number of threads (``threads`` each), so that N processes are N equal
devices, as N GPUs would be.

``measure_allreduce`` times the collective itself between N processes of this machine
(gloo between CPU processes, NCCL between GPUs) at several sizes: an ``Interconnect``
curve for "this machine", like the published ones, so that the prediction can be
checked against the measured runs. GPU ranks under gloo all-reduce through host memory:
their link is built from gloo's all-reduce between CPU processes and the GPU's copies
(``segscale.bench.predict.host_staged_link``), not measured here.

A run that fails says why in one of a few forms, in the order it met them (stdout and
stderr as one stream), and ``first_error`` takes the first: a log record at ERROR
(segscale's refusals, exit 2 and 3), an ``Error: ...`` line (an override refused before
Hydra starts), a Python traceback (the line that names the exception ends it), or
Hydra's own message when the config does not compose (``Could not find
'datamodule/classes/mine'``), printed before its last line, ``Set the environment
variable HYDRA_FULL_ERROR=1 ...``, which names no error at all.
"""

from __future__ import annotations

import json
import logging
import os
import re
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import DictConfig

from segscale.atomic_files import write_text_atomically
from segscale.bench.measure.compute import StepPlan
from segscale.bench.measure.timing import Timing, summarize_steps
from segscale.bench.predict.interconnects import Interconnect, Published, from_published
from segscale.bench.predict.step_model import efficiency, speedup
from segscale.command_line import TRAIN_COMMAND, UTF8_OUTPUT
from segscale.platforms.parallel import default_process_group_backend
from segscale.platforms.processes import end_process_tree
from segscale.progress import Progress
from segscale.training.ranks.launch import free_port

log = logging.getLogger(__name__)

# What the scaling runs set themselves: these keys (and, for groups whose options they
# replace, every key below them) are not passed on from the user's overrides.
OWN_KEYS = (
    "strategy",
    "trainer.devices",
    "trainer.accelerator",
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.limit_val_batches",
    "trainer.enable_checkpointing",
    "ckpt_path",
    "output_dir",
    "task_name",
)
OWN_GROUPS = ("callbacks", "logger", "hydra", "bench")


@dataclass(frozen=True)
class ScalingPoint:
    """One measured N: rank 0's step timing and the global batch of a step."""

    devices: int
    timing: Timing | None
    global_batch: int
    error: str | None = None

    @property
    def throughput(self) -> float | None:
        """Patches/s of all devices together."""
        return self.global_batch / self.timing.mean_s if self.timing else None

    def as_dict(self) -> dict[str, Any]:
        """Plain numbers (for ``bench.json``)."""
        return {
            "devices": self.devices,
            "global_batch": self.global_batch,
            "throughput": self.throughput,
            "timing": self.timing.as_dict() if self.timing else None,
            "error": self.error,
        }


SYNC_BATCHNORM = "training.sync_batchnorm"


def override_key(override: str) -> str:
    """The config key of a command-line override (``+a.b=1`` → ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


def passed_on(overrides: list[str]) -> list[str]:
    """The user's overrides that the scaling runs keep (not the keys they set themselves)."""

    def own(override: str) -> bool:
        key = override_key(override)
        return key in OWN_KEYS or key.split(".")[0] in OWN_GROUPS

    return [override for override in overrides if not own(override)]


def without_key(overrides: list[str], key: str) -> list[str]:
    """``overrides`` without those that set ``key``."""
    return [override for override in overrides if override_key(override) != key]


def scaling_command(
    overrides: list[str],
    devices: int,
    accelerator: str,
    steps: int,
    folder: Path,
    config: list[str],
) -> list[str]:
    """The ``train.py`` command line of the run on ``devices`` devices.

    ``config``: the options that load bench's own config folders and primary config
    (``segscale.command_line.config_options`` of bench's run).
    """
    return [
        *TRAIN_COMMAND,
        *config,
        *passed_on(overrides),
        "strategy=ddp",
        f"trainer.devices={devices}",
        f"trainer.accelerator={accelerator}",
        # ++: set whether or not the trainer config names the key
        f"++trainer.max_steps={steps}",
        "++trainer.max_epochs=-1",
        "++trainer.limit_val_batches=0",
        "++trainer.enable_checkpointing=false",
        "callbacks=none",
        "logger=none",
        "+callbacks.step_timer._target_=segscale.bench.measure.timing.StepTimer",
        f"+callbacks.step_timer.path={folder / 'steps.json'}",
        f"hydra.run.dir={folder}",
    ]


def run_scaling_point(
    command: list[str],
    folder: Path,
    devices: int,
    threads: int | None,
    warmup: int,
    windows: int,
    timeout_s: float,
) -> ScalingPoint:
    """Run one ``scaling_command``; its rank 0 step timing, or the error it ended with.

    Its output (stdout and stderr in the order written) goes to ``folder/console.log``;
    a run that fails is the first error that output names (``first_error``).
    """
    env = os.environ | UTF8_OUTPUT  # its output is read as UTF-8
    if threads:
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    folder.mkdir(parents=True, exist_ok=True)
    with subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",  # a child's output, shown in part: never a reason to fail
    ) as run:
        try:
            console, _ = run.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # the ranks it started (and their workers) go with it: nothing is left running
            end_process_tree(run.pid)
            console, _ = run.communicate()
            write_text_atomically(folder / "console.log", console)
            return ScalingPoint(devices, None, 0, f"no result within {timeout_s:.0f} s")
    write_text_atomically(folder / "console.log", console)
    steps = folder / "steps.json"
    if run.returncode or not steps.is_file():
        return ScalingPoint(devices, None, 0, run_error(run.returncode, console))
    record = json.loads(steps.read_text(encoding="utf-8"))
    timing = summarize_steps(record["durations_s"], warmup, windows)
    return ScalingPoint(devices, timing, record["global_batch"])


def run_error(returncode: int, console: str) -> str:
    """What a scaling run that gave no step timing ended with: its status and first error."""
    # A negative status: killed by a signal (the kernel's out-of-memory killer, ...)
    status = f"killed by signal {-returncode}" if returncode < 0 else f"exit {returncode}"
    error = first_error(console)
    if error is None and returncode == 0:
        error = "it wrote no step timing (steps.json)"
    if error is None:  # none of the forms first_error knows: the last line said
        lines = [line.strip() for line in console.splitlines() if line.strip()]
        error = lines[-1] if lines else "no output"
    return f"{status}: {error}"


ALLREDUCE_SIZES = (4, 4 * 2**10, 64 * 2**10, 2**20)
"""Bytes of the all-reduces ``measure_allreduce`` times besides the large one."""


def _allreduce_rank(
    rank: int, world: int, port: int, nbytes: int, repeats: int, result: str, cuda: bool
) -> None:
    """One rank of ``measure_allreduce``: time each size of ``ALLREDUCE_SIZES`` and ``nbytes``."""
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    if cuda:
        torch.cuda.set_device(rank)  # NCCL binds each rank to its current device
    backend = default_process_group_backend("cuda" if cuda else "cpu")  # gloo on Windows
    dist.init_process_group(backend, rank=rank, world_size=world)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    times = {}
    for size in sorted({*(s for s in ALLREDUCE_SIZES if s < nbytes), nbytes}):
        tensor = torch.ones(max(1, size // 4), device=device)
        samples = []
        for i in range(repeats + 2):  # the first two set up the rings
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            if cuda:
                torch.cuda.synchronize(device)
            if i >= 2:
                samples.append(time.perf_counter() - start)
        times[str(size)] = statistics.median(samples)
    if rank == 0:
        write_text_atomically(result, json.dumps(times))
    dist.destroy_process_group()


def measure_allreduce(world: int, nbytes: int, cuda: bool, repeats: int = 5) -> Interconnect:
    """The all-reduce between ``world`` processes of this machine, as an ``Interconnect`` row.

    Its curve runs through measured points, as the published rows of the other links do:
    all-reduces of 4 B (the latency floor), 4 KiB, 64 KiB and 1 MiB (batch-norm statistics
    and small buckets) and one of ``nbytes`` (the bus bandwidth, ring bytes / time).
    """
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "allreduce.json"
        args = (world, free_port(), nbytes, repeats, str(result), cuda)
        mp.start_processes(_allreduce_rank, args=args, nprocs=world, start_method="spawn")
        times = json.loads(result.read_text(encoding="utf-8"))
    rows = tuple(Published(world, int(size), 1e6 * seconds) for size, seconds in times.items())
    return from_published(
        f"this machine ({'NCCL' if cuda else 'gloo'}, measured)",
        rows,
        f"all-reduces of 4 B to {nbytes / 2**20:.0f} MiB between {world} processes",
    )


def measure_scaling(
    cfg: DictConfig,
    overrides: list[str],
    config: list[str],
    counts: list[int],
    threads: int | None,
    compute: dict[str, Any],
    progress: Progress,
    gpu_backend: str = "nccl",
) -> tuple[dict[str, Any], Interconnect | None]:
    """The ddp runs for each of ``counts`` devices, and this machine's measured all-reduce.

    ``config``: the options that load bench's config folders (``scaling_command``);
    ``threads``: torch threads of each rank on CPUs (``None``: GPUs, one per rank);
    ``gpu_backend``: the GPU ranks' (under gloo no all-reduce is measured here: the
    module docstring says why).
    Synchronized batch norm is as ``cfg`` composed it (the user's override or preset, or
    the default), and flipped in one more run on the most devices.
    """
    options = cfg.bench
    folder = Path(cfg.output_dir) / "scaling"
    accelerator = "cpu" if threads else "cuda"
    plan = StepPlan(options.warmup_steps, options.window_steps, options.windows)
    sync = bool(cfg.training.sync_batchnorm)
    runs: list[tuple[int, str | None]] = [(n, None) for n in counts]
    if max(counts) > 1:  # what synchronized batch norm costs, at the most devices
        runs.append((max(counts), f"{SYNC_BATCHNORM}={str(not sync).lower()}"))
    rows = []
    for n, variant in runs:
        run_folder = folder / (f"devices_{n}" + ("_sync_batchnorm_flipped" if variant else ""))
        run_overrides = [*without_key(overrides, SYNC_BATCHNORM), variant] if variant else overrides
        command = scaling_command(run_overrides, n, accelerator, plan.total, run_folder, config)
        log.info("scaling run: %s", " ".join(command))
        point = run_scaling_point(
            command, run_folder, n, threads, plan.warmup, plan.windows, options.timeout_s
        )
        if point.error:
            log.error("ddp on %d devices %s failed: %s", n, variant or "", point.error)
        console = f"{folder.name}/{run_folder.name}/console.log"  # in bench's run folder
        rows.append(point.as_dict() | {"variant": variant, "console": console})
        progress(f"ddp on {n} devices {variant or ''}" + (" (failed)" if point.error else ""))
    here = None
    if max(counts) > 1 and not (accelerator == "cuda" and gpu_backend == "gloo"):
        bucket = int(min(compute["gradient_bytes"], options.bucket_mb * 2**20))
        here = measure_allreduce(max(counts), bucket, accelerator == "cuda")
    one = next((r["throughput"] for r in rows if r["devices"] == 1 and r["throughput"]), None)
    for row in rows:
        gain = speedup(row["throughput"], one) if one and row["throughput"] else None
        row |= {"speedup": gain, "efficiency": efficiency(gain, row["devices"]) if gain else None}
    per_device = f"{threads} thread(s) per process" if threads else "one GPU per process"
    measured = {"per_device": per_device, "threads": threads, "sync_batchnorm": sync}
    return measured | {"measured": rows}, here


HYDRA_HINT = "Set the environment variable HYDRA_FULL_ERROR=1"
"""The start of the line Hydra ends every error with (its advice, not the error)."""

LOG_RECORD = re.compile(r"^\[[^\]]*\]\[[^\]]*\]\[(?P<level>[A-Z]+)\] - (?P<message>.*)$")
"""A record in Hydra's console format: ``[time][logger][LEVEL] - message``."""

WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")
"""Python's warning line (``path:line: Category: message``); its source line follows indented."""

TRACEBACK = "Traceback (most recent call last):"
HYDRA_JOB_ERROR = "Error executing job with overrides:"  # Hydra's line before a traceback
REFUSED = "Error: "  # segscale's refusal before Hydra starts (a moved key)


def first_error(console: str) -> str | None:
    """The first error ``console`` names (module docstring); ``None`` if it names none."""
    lines = console.splitlines()
    last_record = -1
    for index, line in enumerate(lines):
        record = LOG_RECORD.match(line)
        if record:
            if record["level"] in ("ERROR", "CRITICAL"):
                return record["message"].strip()
            last_record = index
        elif line.startswith(TRACEBACK):
            return _exception_line(lines[index + 1 :]) or line
        elif line.startswith(REFUSED):
            return line[len(REFUSED) :].strip()
    if any(line.startswith(HYDRA_HINT) for line in lines):
        return _hydra_message(lines[last_record + 1 :])
    return None


def _exception_line(lines: list[str]) -> str | None:
    """The line that ends a traceback: the first one not indented (its frames are)."""
    return next((line.strip() for line in lines if line.strip() and not line[0].isspace()), None)


def _hydra_message(lines: list[str]) -> str | None:
    """The first line of Hydra's message: not a warning, its source line, or the hint."""
    for line in lines:
        if not line.strip() or line[0].isspace() or WARNING.match(line):
            continue
        if line.startswith(HYDRA_HINT) or line.startswith(HYDRA_JOB_ERROR):
            continue
        return line.strip()
    return None
