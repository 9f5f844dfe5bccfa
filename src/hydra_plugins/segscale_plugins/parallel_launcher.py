"""``hydra/launcher=parallel``: a sweep's jobs run at once, each on its own devices.

Every job is a separate ``train.py`` process (so DataLoader workers and DDP ranks work
inside it), started with the job's own overrides and ``hydra.run.dir`` set to the job's
folder of the sweep. On a machine with GPUs each job gets ``trainer.devices`` GPUs of
its own through ``CUDA_VISIBLE_DEVICES``; jobs that do not fit wait in a queue, in
order. Without GPUs, ``cpu_jobs`` jobs run at once and the CPU threads are divided
between them. A job that fails is reported (with the end of its output) and the
others go on; the sweeper then decides what a failure means.

``launch`` runs a batch and returns when all of it ended (Hydra's interface, for any
sweeper). ``start`` and ``next_finished`` stream: a sweeper starts a job whenever it
likes and takes each result as soon as that job ends, so a freed slot is refilled at
once (the Optuna sweeper's asynchronous trials).
"""

import logging
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from segscale.command_line import UTF8_OUTPUT, config_options, program_command, quoted_override
from segscale.devices import devices_count, is_device_list, resolve_accelerator
from segscale.errors import ConfigError
from segscale.platforms.cores import cpus_available
from segscale.runs.folder import read_summary
from segscale.sweeps.failed_jobs import JobFailedError
from segscale.sweeps.sweep_summary import objective

log = logging.getLogger(__name__)

# Hydra overrides of the sweep that a job's own process must not get.
SWEEP_ONLY = ("hydra/launcher", "hydra.launcher", "hydra/sweeper", "hydra.sweeper", "hydra.mode")


@dataclass
class JobPlan:
    """One job of the batch: its number, overrides, folder and what it needs."""

    number: int
    overrides: list[str]
    config: DictConfig
    folder: Path
    gpus: int  # 0: a CPU job
    processes: int
    process: subprocess.Popen | None = None
    granted: list[str] = field(default_factory=list)
    started: float = 0.0

    @property
    def started_process(self) -> subprocess.Popen:
        """The job's process, once ``ParallelLauncher._start`` started it."""
        assert self.process is not None, f"job {self.number} was not started"
        return self.process

    @property
    def console(self) -> Path:
        """The file that gets the job's stdout and stderr."""
        return self.folder / "console.log"


@dataclass
class JobPool:
    """The devices a launcher shares out and its jobs: waiting, running, ended."""

    gpus: list[str]
    free_gpus: list[str]
    free_slots: int  # CPU jobs that may start now
    threads: int  # CPU threads of one CPU job
    queue: list[JobPlan] = field(default_factory=list)
    running: list[JobPlan] = field(default_factory=list)
    done: list[tuple[int, JobReturn]] = field(default_factory=list)


class ParallelLauncher(Launcher):
    """Runs the jobs of a sweep concurrently, one device group each (see module doc)."""

    def __init__(
        self, cpu_jobs: int = 2, gpus: Sequence[int] | None = None, poll_s: float = 0.2
    ) -> None:
        if not (isinstance(cpu_jobs, int) and cpu_jobs >= 1):
            raise ConfigError(
                f"hydra.launcher.cpu_jobs={cpu_jobs!r} is not allowed: expected the number "
                "of jobs to run at once on the CPU (an integer >= 1)"
            )
        self.cpu_jobs = cpu_jobs
        self.gpus = gpus
        self.poll_s = poll_s
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self._pool: JobPool | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        """Keep the sweep's config (the jobs run as processes, not the task function)."""
        self.config = config
        self.hydra_context = hydra_context

    def gpu_ids(self) -> list[str]:
        """The GPUs to share out, as ``CUDA_VISIBLE_DEVICES`` names them."""
        count = torch.cuda.device_count()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        names = visible.split(",") if visible else [str(i) for i in range(count)]
        names = names[:count]
        if self.gpus is None:
            return names
        missing = [i for i in self.gpus if not 0 <= i < count]
        if missing:
            raise ConfigError(
                f"hydra.launcher.gpus={list(self.gpus)} names GPU(s) {missing} this machine "
                f"does not have (it has {count})"
            )
        return [names[i] for i in self.gpus]

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        """Run the jobs, at most as many at once as the devices allow; return each result."""
        pool = self._open()
        plans = [
            self._plan(initial_job_idx + i, list(o), bool(pool.gpus))
            for i, o in enumerate(job_overrides)
        ]
        for plan in plans:  # every job must fit before any starts
            self._check_fits(plan, pool)
        log.info("Launching %d jobs", len(plans))
        for plan in plans:
            self._enqueue(plan)
        results: dict[int, JobReturn] = {}
        while len(results) < len(plans):
            number, result = self.next_finished()
            results[number] = result
        return [results[plan.number] for plan in plans]

    def start(self, overrides: Sequence[str], number: int) -> None:
        """Start job ``number`` now, or as soon as devices free (see ``next_finished``).

        The streaming counterpart of ``launch``: a sweeper starts jobs one at a time and
        takes each result as it comes, so a slot that frees is filled at once.
        """
        pool = self._open()
        plan = self._plan(number, list(overrides), bool(pool.gpus))
        self._check_fits(plan, pool)
        self._enqueue(plan)

    @property
    def jobs_in_flight(self) -> int:
        """Jobs started with ``start`` or ``launch`` whose result was not yet taken."""
        pool = self._pool
        return 0 if pool is None else len(pool.queue) + len(pool.running) + len(pool.done)

    def next_finished(self) -> tuple[int, JobReturn]:
        """Wait for the next job to end; return its number and result.

        Jobs waiting for devices start as soon as a running one ends.
        """
        pool = self._pool
        if pool is None or not (pool.queue or pool.running or pool.done):
            raise RuntimeError("next_finished: no job was started")
        while not pool.done:
            time.sleep(self.poll_s)
            for plan in [p for p in pool.running if p.started_process.poll() is not None]:
                pool.running.remove(plan)
                pool.free_gpus += plan.granted
                pool.free_slots += 0 if plan.gpus else 1
                pool.done.append((plan.number, self._result(plan)))
            self._start_queued()
        return pool.done.pop(0)

    def _open(self) -> JobPool:
        """The devices and queues of this launcher's jobs (made when the first job comes)."""
        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        if self._pool is None:
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
            gpus = self.gpu_ids()
            # The cores this process may use (its affinity mask under SLURM, cgroups or
            # taskset), not all the machine's: the jobs share those.
            threads = max(1, cpus_available() // self.cpu_jobs)
            self._pool = JobPool(gpus, list(gpus), self.cpu_jobs, threads)
            mode = f"{len(gpus)} GPUs" if gpus else f"{self.cpu_jobs} CPU jobs at once"
            log.info("Jobs run in parallel (%s)", mode)
        return self._pool

    def _check_fits(self, plan: JobPlan, pool: JobPool) -> None:
        if plan.gpus > len(pool.gpus):
            raise ConfigError(
                f"job {plan.number} ({' '.join(plan.overrides)}) asks for trainer.devices="
                f"{plan.gpus} GPUs, but hydra/launcher=parallel has {len(pool.gpus)} to share out"
            )

    def _enqueue(self, plan: JobPlan) -> None:
        assert self._pool is not None  # _open made it
        self._pool.queue.append(plan)
        self._start_queued()

    def _start_queued(self) -> None:
        """Start the waiting jobs, in order, while the head of the queue fits."""
        pool = self._pool
        assert pool is not None  # _open made it
        while pool.queue:
            head = pool.queue[0]
            if head.gpus and len(pool.free_gpus) >= head.gpus:
                head.granted, pool.free_gpus = (
                    pool.free_gpus[: head.gpus],
                    pool.free_gpus[head.gpus :],
                )
            elif not head.gpus and pool.free_slots > 0:
                pool.free_slots -= 1
            else:
                break
            self._start(pool.queue.pop(0), pool.threads)
            pool.running.append(head)

    def _plan(self, number: int, overrides: list[str], have_gpus: bool) -> JobPlan:
        assert self.config is not None and self.hydra_context is not None  # as launch checked
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config):
            config.hydra.job.id = config.hydra.job.num = number
        HydraConfig.instance().set_config(config)
        folder = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
        devices = config.trainer.devices
        on_gpu = have_gpus and resolve_accelerator(config.trainer.accelerator) == "cuda"
        if on_gpu and is_device_list(devices):
            raise ConfigError(
                f"trainer.devices={list(devices)} lists GPUs, but hydra/launcher=parallel "
                "picks each job's GPUs itself: give a count, e.g. trainer.devices=2"
            )
        processes = devices_count(devices, None if on_gpu else 1)
        return JobPlan(number, overrides, config, folder, processes if on_gpu else 0, processes)

    def _start(self, plan: JobPlan, threads: int) -> None:
        assert self.config is not None  # as launch checked
        plan.folder.mkdir(parents=True, exist_ok=True)
        # The job's config folders and primary config (--config-dir, --config-path,
        # --config-name, hydra.searchpath), as for the ranks of a DDP job.
        options = config_options(self.config.hydra)
        hydra_overrides = [
            o
            for o in self.config.hydra.overrides.hydra
            if not o.startswith(SWEEP_ONLY) and o not in options
        ]
        command = [
            *program_command(),
            *options,
            *plan.overrides,
            *hydra_overrides,
            f"hydra.run.dir={quoted_override(str(plan.folder))}",
            f"hydra.job.num={plan.number}",
        ]
        env = os.environ | UTF8_OUTPUT  # console.log is read back as UTF-8
        if plan.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(plan.granted)
        else:
            env["OMP_NUM_THREADS"] = str(max(1, threads // plan.processes))
        where = f"GPU {','.join(plan.granted)}" if plan.gpus else "CPU"
        log.info("\t#%d (%s): %s", plan.number, where, " ".join(filter_overrides(plan.overrides)))
        console = plan.console.open("wb")  # the child writes its own bytes
        plan.started = time.perf_counter()
        plan.process = subprocess.Popen(
            command, env=env, stdout=console, stderr=subprocess.STDOUT, cwd=os.getcwd()
        )
        console.close()

    def _result(self, plan: JobPlan) -> JobReturn:
        code = plan.started_process.returncode
        seconds = time.perf_counter() - plan.started
        result = JobReturn(
            overrides=plan.overrides,
            cfg=plan.config,
            hydra_cfg=plan.config,
            working_dir=os.getcwd(),
            task_name=str(plan.config.hydra.job.name),
        )
        if code == 0:
            log.info("\t#%d finished in %.0f s", plan.number, seconds)
            result.status = JobStatus.COMPLETED
            # What the job's task function returned, from the summary it wrote.
            result.return_value = objective(plan.config, read_summary(plan.folder) or {})
            return result
        output = plan.console.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        tail = "\n".join(output[-15:])
        log.error(
            "\t#%d failed with exit code %d after %.0f s; its output (%s):\n%s",
            plan.number,
            code,
            seconds,
            plan.console,
            tail,
        )
        result.status = JobStatus.FAILED
        result.return_value = JobFailedError(
            f"job {plan.number} failed with exit code {code}; see {plan.console}", code
        )
        return result
