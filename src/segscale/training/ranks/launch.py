"""A run's processes: a DDP job's extra ranks, strategy=single's one, the workers' end.

The extra ranks are started, watched and stopped here; those that torchrun or SLURM
started are recognised.

Lightning's own ``ddp`` launcher re-executes ``sys.argv`` for every extra rank. Under a
Hydra multirun that re-runs the whole sweep in each rank. We start the ranks ourselves
instead: each extra rank runs ``train.py`` with *this job's* resolved overrides and
``hydra.run.dir`` set to this job's folder, and is told its rank through the standard
variables (``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). Lightning
sees ``LOCAL_RANK`` and does not launch anything itself. Ranks started by ``torchrun``
or by SLURM's ``srun`` (one task per device) are started already, and then nothing is
started here either.

``strategy=single`` (``single_device_strategy``) is one process on one device: more
devices are an error that names ``strategy=ddp``.

A run's DataLoader worker processes end with the run, however it ends
(``WorkersEndWithRun``). Lightning shuts the workers down when a stage ends, and on an
exception only those of the loop it takes for the active one: a failure during the
validation inside ``fit`` (a non-finite validation loss, say) leaves the training
loader's persistent workers running. At exit torch no longer shuts them down (its own
exit hook has run by then), and multiprocessing terminates and joins them with a
``SIGTERM`` that workers ignore (``segscale.data.sampling.loaders.init_worker``): the
process would wait for them forever. So on leaving the run, the fit loop is torn down
whatever happened, which shuts its loaders' workers down, and any worker process the
run started that is still alive after that is killed: a worker holds no state of its own.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy
from omegaconf import DictConfig

from segscale.command_line import config_options, program_command, quoted_override
from segscale.devices import (
    available_devices,
    devices_count,
    is_device_list,
    resolve_accelerator,
    shown_devices,
    slurm_task_rank,
)
from segscale.errors import ConfigError, RunStopped
from segscale.models.nonfinite import NonFiniteError
from segscale.platforms.processes import end_this_process
from segscale.platforms.signals import child_exits_unwatched

log = logging.getLogger(__name__)

GRACE_S = 15.0
"""Seconds a failed rank's peers get to notice, report and exit before being stopped."""


class RankProcesses:
    """The extra ranks (1 … N-1) of a job whose rank 0 is this process.

    A watchdog thread follows them: when one fails, the others are stopped and this
    process is ended too, so a crash on one rank never leaves the rest waiting forever
    in a collective.
    """

    def __init__(self, commands: list[list[str]], envs: list[dict[str, str]], cwd: str) -> None:
        self.processes = [
            subprocess.Popen(c, env=e, cwd=cwd) for c, e in zip(commands, envs, strict=True)
        ]
        self._done = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        while not self._done.wait(0.5):
            for rank, process in enumerate(self.processes, start=1):
                code = process.poll()
                # Once rank 0 stops the ranks itself (_done), their exits are expected.
                if code in (None, 0) or self._done.is_set():
                    continue
                # Rank 0 usually notices (a collective fails) and reports this rank's
                # error itself; if it is stuck in a collective instead, end it.
                if self._done.wait(GRACE_S):
                    return
                log.error("rank %d exited with code %d; stopping the other ranks", rank, code)
                self.terminate()
                end_this_process()

    def failures(self, grace_s: float = GRACE_S) -> list[tuple[int, int]]:
        """Let the ranks exit by themselves for ``grace_s``, stop the rest, list failures.

        Used when rank 0 failed: a rank whose own error caused it gets the time to
        print that error before it is stopped.
        """
        self._done.set()
        deadline = time.monotonic() + grace_s
        for process in self.processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        failed = [
            (rank, process.returncode)
            for rank, process in enumerate(self.processes, start=1)
            if process.returncode not in (None, 0)
        ]
        self.terminate()
        return failed

    def wait(self, timeout_s: float = 300.0) -> None:
        """Wait for every extra rank to finish; raise if one failed."""
        deadline = time.monotonic() + timeout_s
        self._done.set()
        for rank, process in enumerate(self.processes, start=1):
            try:
                code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.terminate()
                raise RuntimeError(
                    f"rank {rank} did not finish within {timeout_s:.0f} s of rank 0"
                ) from None
            if code != 0:
                raise RuntimeError(f"rank {rank} exited with code {code}")

    def terminate(self) -> None:
        """Stop every extra rank that is still running."""
        self._done.set()
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def must_start_ranks(start_method: str | None, num_processes: int) -> bool:
    """Whether this process must start the job's other ranks itself."""
    return start_method == "popen" and num_processes > 1 and not started_by_launcher()


def started_by_launcher() -> bool:
    """Whether torchrun (``LOCAL_RANK``) or SLURM's srun (several tasks) started the ranks."""
    return "LOCAL_RANK" in os.environ or slurm_task_rank()


AGREED_FAILURES = (ConfigError, NonFiniteError, RunStopped)
"""Failures every rank meets alike (the same check, a loss flag all-reduced, a stop the
ranks agreed on): rank 0's own error then names the cause, and is the one reported."""


@contextmanager
def job_ranks(
    start_method: str | None,
    num_processes: int,
    output_dir: str,
    num_nodes: int = 1,
    resolved: dict[str, str] | None = None,
) -> Iterator[None]:
    """Run the body as rank 0 of a DDP job, with ranks 1 … N-1 started beside it.

    Does nothing unless ``must_start_ranks``. On leaving, waits for the other ranks (or
    stops them if the body raised) and tears down the process group, so the next job of
    a multirun starts clean. Ranks on other nodes cannot be started from here.
    ``resolved`` holds values rank 0 settled that the others must not work out again
    (the checkpoint that ``ckpt_path=last`` means, say).
    """
    if start_method == "popen" and num_nodes != 1 and not started_by_launcher():
        raise ConfigError(
            f"trainer.num_nodes={num_nodes}: the ranks of a multi-node job must be started "
            "on every node by torchrun or SLURM's srun (one task per device)"
        )
    if not must_start_ranks(start_method, num_processes):
        warn_if_restarts_may_hang()
        try:
            yield
        finally:
            _destroy_process_group()
        return
    # The ranks inherit this process's environment, OMP_NUM_THREADS included: the
    # threads each rank computes with (training.threads, set by run.py).
    # Nothing is added for Windows' TCPStore: torch >= 2.4 defaults the store to libuv,
    # which its Windows builds lack ("use_libuv was requested but PyTorch was built
    # without libuv support", pytorch/pytorch#139990, Lightning-AI/pytorch-lightning#20238).
    # The ranks' store is init_process_group's env:// rendezvous, which on Windows takes
    # the old store unless USE_LIBUV=1 (torch 2.14's torch/distributed/rendezvous.py,
    # since pytorch/pytorch#148266), and `import lightning` sets USE_LIBUV=0 there anyway
    # (lightning/fabric/__init__.py), inherited here. torchrun's own stores (its c10d and
    # static rendezvous) still ask for libuv whatever USE_LIBUV says (pytorch/pytorch#178600,
    # open): torchrun does not start on Windows; strategy=ddp's ranks do.
    saved = dict(os.environ)
    shared = {
        "MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1"),
        "MASTER_PORT": os.environ.get("MASTER_PORT", str(free_port())),
        "WORLD_SIZE": str(num_processes),
        "NODE_RANK": "0",
    }
    envs = [saved | shared | {"LOCAL_RANK": str(r)} for r in range(1, num_processes)]
    commands = [rank_command(r, output_dir, resolved) for r in range(1, num_processes)]
    os.environ.update(shared | {"LOCAL_RANK": "0"})
    log.info("started ranks 1..%d: %s", num_processes - 1, " ".join(commands[0]))
    ranks = RankProcesses(commands, envs, cwd=os.getcwd())
    try:
        yield
    except Exception as error:
        failed = ranks.failures()
        if not failed or isinstance(error, AGREED_FAILURES):
            ranks.terminate()
            raise
        rank, code = failed[0]
        # Rank 0's own error (a broken collective) is a consequence; name the cause.
        raise RuntimeError(
            f"rank {rank} failed with exit code {code}; its error is printed above "
            f"(rank 0 then stopped with: {str(error).splitlines()[0][:200]})"
        ) from None
    except BaseException:
        ranks.terminate()
        raise
    else:
        ranks.wait()
    finally:
        _destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)


QUIET_RANK_OVERRIDES = (
    "hydra.output_subdir=null",  # rank 0 alone writes the config
    "hydra/job_logging=none",  # and the log file
    "hydra/hydra_logging=none",
)


def external_rank() -> int | None:
    """The global rank of this process when torchrun or SLURM started it, else ``None``."""
    for variable in ("RANK", "SLURM_PROCID"):
        if variable in os.environ:
            return int(os.environ[variable])
    return None


def warn_if_restarts_may_hang() -> None:
    """Warn when torchrun restarts ranks through a rendezvous store that the old ones used.

    torchrun's c10d rendezvous shares its store with the ranks by default, and keeps it
    across restarts: a restarted group can read the dead group's addresses there and
    fail or hang at its first collective (pytorch/pytorch#135712). Only torchrun's own
    process can avoid it, with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``.
    """
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if restarts > 0 and shared and os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1":
        log.warning(
            "torchrun --max-restarts=%d with a shared rendezvous store: a restart may hang or "
            "fail to connect (pytorch/pytorch#135712); start torchrun with "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
            restarts,
        )


def launcher_job_id() -> str | None:
    """The job id that torchrun (``--rdzv-id``) or SLURM gives all ranks of one run."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if run_id != "none":
        return run_id
    return os.environ.get("SLURM_JOB_ID")


def rank_command(
    local_rank: int, output_dir: str, resolved: dict[str, str] | None = None
) -> list[str]:
    """The command line that runs rank ``local_rank`` of the current Hydra job.

    It carries the job's own overrides, with the keys in ``resolved`` replaced by
    rank 0's values, and the job's config folders and primary config (``config_options``).
    """
    from hydra.core.hydra_config import HydraConfig

    # Typed as the HydraConf dataclass; what it returns is the DictConfig made from it.
    hydra_cfg = cast(DictConfig, HydraConfig.get())
    resolved = resolved or {}
    overrides = [
        o for o in hydra_cfg.overrides.task if o.lstrip("+~").split("=")[0] not in resolved
    ]
    return [
        *program_command(),
        *config_options(hydra_cfg),
        *overrides,
        *(f"{key}={quoted_override(value)}" for key, value in resolved.items()),
        f"hydra.run.dir={quoted_override(output_dir)}",
        *QUIET_RANK_OVERRIDES,
        f"hydra.job.name=rank{local_rank}",
    ]


def free_port() -> int:
    """A TCP port on this host that no one listens on now (for a rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def single_device_strategy(accelerator: str = "auto", devices: Any = 1) -> SingleDeviceStrategy:
    """One process on one device; an error that names ``strategy=ddp`` for more."""
    count = devices_count(devices, available_devices(accelerator))
    if count != 1:
        raise ConfigError(
            f"strategy=single runs one process on one device, but "
            f"trainer.devices={shown_devices(devices)} asks for {count}; use strategy=ddp "
            "(or strategy=ddp_spawn) to train on several devices"
        )
    kind = resolve_accelerator(accelerator)
    if kind == "cpu":
        return SingleDeviceStrategy(device=torch.device("cpu"))
    index = next(iter(devices)) if is_device_list(devices) else 0
    return SingleDeviceStrategy(device=torch.device(kind, index))


KILL_WAIT_S = 5.0
"""Seconds to wait for a killed worker to be gone (the kernel's part; instant in practice)."""


class WorkersEndWithRun:
    """Context: every worker process started inside it is gone when it is left.

    ``follow`` names the trainer whose loops' workers to shut down first, the way
    Lightning does at the end of a stage.
    """

    def __init__(self) -> None:
        self.trainer: L.Trainer | None = None
        self._before: set[int | None] = set()

    def __enter__(self) -> WorkersEndWithRun:
        self._before = {process.pid for process in multiprocessing.active_children()}
        return self

    def follow(self, trainer: L.Trainer) -> None:
        """Shut down the workers of ``trainer``'s loops on leaving."""
        self.trainer = trainer

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.trainer is not None:
            # Tears down the training loader and the validation loop's: harmless where
            # Lightning did it already (each loop forgets its fetcher once torn down).
            self.trainer.fit_loop.teardown()
        left = [p for p in multiprocessing.active_children() if p.pid not in self._before]
        if left:
            log.warning("stopping %d DataLoader worker(s) that outlived the run", len(left))
            _kill(left)


def _kill(processes: list[Any]) -> None:
    """Kill ``processes`` (multiprocessing children) and reap them.

    A worker still registered with torch's ``SIGCHLD`` handler would make it raise in
    this thread ("worker exited unexpectedly"): the handler is set aside meanwhile.
    """
    with child_exits_unwatched():
        for process in processes:
            process.kill()
        for process in processes:
            process.join(timeout=KILL_WAIT_S)
