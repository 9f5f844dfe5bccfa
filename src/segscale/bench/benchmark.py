"""``bench``: will more devices make this training faster, and by how much.

``bench`` composes the same config as ``train.py`` (``conf/bench.yaml`` extends
``conf/train.yaml`` with a ``bench`` section, checked here: ``check_bench``) and, for
that config on this machine, measures in turn (``segscale.bench.measure``): the data
pipeline (``pipeline``; the tiles as stored against decoded into memory, ``storage``),
one device's training step in Lightning and in a bare PyTorch loop (``compute``), DDP's
gradient buckets (``gradients``), FLOPs (``flops``), the framework's overhead per step
(``overhead``), the performance options one at a time (``performance_options``), short
``train.py`` runs with ``strategy=ddp`` on 1, 2, … devices (``ddp_runs``) and, on CPUs,
N loops side by side (``sharing``). From these the step model
(``segscale.bench.predict``, fed by ``segscale.bench.predicted_scaling``) predicts 2, 4
and 8 devices over the published interconnects (on GPUs whose ranks would use gloo,
also over gloo's link through host memory, ``host_staged_link``) and this machine's N;
the verdict (``segscale.bench.verdict``), a table, ``bench.json`` and two plots
(``segscale.bench.report``) go into the run folder.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from segscale.bench import report
from segscale.bench.duration import duration_text, plan_duration
from segscale.bench.measure.compute import (
    StepPlan,
    autocast,
    framework_comparison,
    gradient_bytes,
    parameter_count,
)
from segscale.bench.measure.ddp_runs import measure_allreduce, measure_scaling
from segscale.bench.measure.flops import measure_utilisation
from segscale.bench.measure.gradients import buffer_bytes, measure_gradients
from segscale.bench.measure.overhead import measure_overhead
from segscale.bench.measure.performance_options import measure_options, option_variants
from segscale.bench.measure.pipeline import (
    doubling_counts,
    measure_pipeline,
    rank_data_rate,
    worker_counts,
)
from segscale.bench.measure.sharing import batchnorm_layers, sharing, side_by_side
from segscale.bench.measure.storage import measure_storage
from segscale.bench.predict.host_staged_link import HostStagedLink, gpu_backend, measure_copies
from segscale.bench.predict.interconnects import Link
from segscale.bench.predicted_scaling import ModelInputs, prediction_rows
from segscale.bench.verdict import failed_measurements, findings_from, verdict
from segscale.devices import resolve_accelerator
from segscale.errors import ConfigError, integer_at_least, require
from segscale.platforms.cores import cpus_available
from segscale.platforms.processes import keep_freed_memory, process_age
from segscale.progress import Progress
from segscale.runs.builders import build, build_datamodule, build_module
from segscale.training.ranks.threads import resolve_threads
from segscale.training.run.config_checks import prepare

log = logging.getLogger(__name__)


def bench(cfg: DictConfig, overrides: list[str], config: Sequence[str] = ()) -> dict[str, Any]:
    """Measure ``cfg`` on this machine, predict more devices; return ``bench.json``'s content.

    ``overrides`` are the command line's and ``config`` the options that load the config
    folders bench's run loaded (``segscale.command_line.config_options``): both passed
    on to the ``train.py`` runs. Its ``failed`` lists the measurements that failed.
    """
    backend = gpu_backend(cfg.strategy.get("process_group_backend"))  # refused first
    prepare(cfg)  # datamodule/classes=auto resolved, the values checked
    check_bench(cfg.bench)
    if cfg.training.keep_freed_memory and (kept := keep_freed_memory()):  # as train.py
        log.info("%s", kept)
    options = cfg.bench
    L.seed_everything(cfg.seed, workers=True)
    accelerator = resolve_accelerator(cfg.trainer.accelerator)
    on_gpu = accelerator == "cuda"
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    autocast(cfg.trainer.precision, device)  # refuses a precision the bare loop cannot run
    effective = build(cfg.scaling).resolve(cfg.datamodule.batch_size, cfg.optimizer.lr, 1)
    datamodule = build_datamodule(cfg, effective)
    datamodule.check()
    cpus = cpus_available()
    configured_workers = datamodule.workers_per_rank()
    available = torch.cuda.device_count() if on_gpu else cpus
    counts = device_counts(options.devices, available)
    rank_workers = {
        n: datamodule.workers_per_rank(n) for n in {1, *counts, *options.predict_devices}
    }
    workers = worker_counts(cpus, configured_workers)
    if options.workers:  # the configured count is measured too: the verdict needs it
        workers = sorted({int(w) for w in options.workers} | {configured_workers})
    workers = sorted(set(workers) | set(rank_workers.values()))
    variants = option_variants(cfg, list(options.options or []), on_gpu)
    # The one device is a `python train.py` run's: the threads its training.threads gives
    # one rank (train.py's own decision, measured now as a run measures at its start)
    # and the DataLoader workers it gives that rank.
    run_threads = resolve_threads(
        OmegaConf.select(cfg, "training.threads", default="auto"), 1, rank_workers[1]
    )
    log.info("one device, as train.py would run it: %s", run_threads.describe())
    threads: int | None = None  # the ddp runs' and side-by-side loops' threads per rank
    if not on_gpu:  # a CPU "device" is a process with its share of the cores, here too
        threads = options.threads_per_process or max(1, cpus // max(counts))
    scaling_runs = len(counts) + (max(counts) > 1)  # and sync batch norm flipped
    side_by_side_runs = 2 if threads and max(counts) > 1 else 0
    staged = on_gpu and backend.name == "gloo"  # GPU ranks all-reduce through host memory
    measurements = 2 + len(workers) + 3 + len(variants) + scaling_runs + side_by_side_runs
    progress = Progress(measurements + staged + 1, "bench", log)
    # The train.py runs: each device count, and the largest again with sync batch norm
    # flipped; on CPUs their ranks (and the side-by-side processes) compute with
    # `threads` threads each, where the one device had the run's.
    run_ranks = [*counts, max(counts)] if max(counts) > 1 else list(counts)
    plan = plan_duration(
        options,
        len(workers),
        len(variants),
        run_ranks,
        (1, max(counts)) if side_by_side_runs else (),
        slowdown=run_threads.count / threads if threads else 1.0,
        compiles=any("training.compile" in variant for variant in variants),
    )
    log.info("%s", plan.describe())
    started = time.perf_counter()
    startup_s = process_age()  # what each train.py run's start-up repeats
    threads_before = torch.get_num_threads()
    try:
        torch.set_num_threads(run_threads.count)
        pipeline = measure_pipeline(datamodule, workers, options.seconds, progress)
        storage = measure_storage(
            datamodule, configured_workers, options.seconds, int(options.in_memory_gb * 1e9)
        )
        progress("pipeline: tiles as stored and in memory")
        in_process = datamodule.train_dataloader(num_workers=0)
        batch = next(iter(in_process))
        module = build_module(cfg, datamodule, effective.learning_rate)
        steps = StepPlan(options.warmup_steps, options.window_steps, options.windows)
        trainer_options = {
            "accelerator": accelerator,
            "precision": cfg.trainer.precision,
            "benchmark": cfg.trainer.get("benchmark"),
            "log_every_n_steps": cfg.trainer.log_every_n_steps,
        }
        comparison = framework_comparison(module, batch, trainer_options, device, steps)
        bare, lightning = comparison.bare, comparison.lightning
        progress("compute")
        estimate_s = plan.estimate_s(lightning.mean_s, startup_s or 0.0)
        log.info("%s", plan.describe_rest(lightning.mean_s, startup_s))
        precision = str(cfg.trainer.precision)
        gradients = measure_gradients(
            copy.deepcopy(module), batch, precision, device, int(options.bucket_mb * 2**20)
        )
        flops = measure_utilisation(module, batch, lightning.mean_s, device, precision)
        progress("gradients and FLOPs")
        overhead = measure_overhead(
            cfg, device, steps=options.overhead_steps, rounds=options.overhead_rounds
        )
        progress("framework overhead")
        norms = batchnorm_layers(module)
        compute = {
            "device": torch.cuda.get_device_name(device) if on_gpu else f"CPU ({cpus} cores)",
            "threads": torch.get_num_threads(),
            "threads_reason": run_threads.reason,
            "loader_workers": rank_workers[1],
            "batch": int(batch["image"].shape[0]),
            "precision": str(cfg.trainer.precision),
            "lightning": lightning.as_dict(),
            "bare": bare.as_dict(),
            "framework_ratio": comparison.ratio,
            "peak_memory_mb": comparison.peak_memory_mb,
            "memory_kind": "GPU, allocated" if on_gpu else "process peak RSS",
            "parameters": parameter_count(module),
            "gradient_bytes": gradient_bytes(module),
            "buffer_bytes": buffer_bytes(module),
            "batchnorm_layers": len(norms),
            # batchnorm_layers gives _BatchNorm layers, whose num_features is an int
            "batchnorm_channels": sum(cast(int, m.num_features) for m in norms),
            "buckets": list(gradients.buckets),
            "bucket_ready": list(gradients.ready),
            "steps_per_epoch": len(in_process),
            "overhead": overhead.as_dict(),
            "flops": flops.as_dict(),
        }
        option_rows = measure_options(
            cfg, variants, datamodule, effective.learning_rate, batch, device, options, progress
        )
        measured, measured_here = measure_scaling(
            cfg, overrides, list(config), counts, threads, compute, progress, backend.name
        )
        here: Link | None = measured_here
        gloo = None
        if staged:  # gloo's all-reduce between host processes, this GPU's copies
            bucket = int(min(compute["gradient_bytes"], options.bucket_mb * 2**20))
            host = measure_allreduce(max(2, *counts), bucket, cuda=False)
            gloo = HostStagedLink(host, measure_copies(device, bucket))
            here = gloo if max(counts) > 1 else None
            progress("gloo through host memory")
        shared = None
        if side_by_side_runs:
            assert threads  # side_by_side_runs is 0 without threads
            plan_steps = (options.warmup_steps, options.window_steps)
            alone = side_by_side(cfg, 1, threads, *plan_steps)
            progress("one loop alone")
            together = side_by_side(cfg, max(counts), threads, *plan_steps)
            progress(f"{max(counts)} loops side by side")
            shared = sharing(alone, together)
        rates = {n: rank_data_rate(pipeline.loader[w], n, w, cpus) for n, w in rank_workers.items()}
        one = next((r for r in measured["measured"] if r["devices"] == 1 and r["timing"]), None)
        if one:  # bench's step against a real train.py run's steady step, same config
            compute["run_step_s"] = one["timing"]["mean_s"]
            # on CPUs only where that run had the one device's threads (the ddp runs have
            # bench.threads_per_process each, the same for every N)
            same = threads is None or threads == compute["threads"]
            compute["step_vs_run"] = lightning.mean_s / one["timing"]["mean_s"] if same else None
        inputs = ModelInputs(
            bare,
            lightning,
            compute,
            gradients,
            rates,
            shared,
            measured["sync_batchnorm"],
            one["timing"]["mean_s"] if one else None,
        )
        prediction = prediction_rows(inputs, options, here, counts, on_gpu, backend, gloo)
        progress("prediction")
    finally:
        progress.close()
        torch.set_num_threads(threads_before)
    took = time.perf_counter() - started
    log.info(
        "bench took %s (estimated %s once the step was measured)",
        duration_text(took),
        duration_text(estimate_s),
    )
    results: dict[str, Any] = {
        "config": {
            "overrides": overrides,
            "config_options": list(config),
            "accelerator": accelerator,
            "cpus": cpus,
        },
        "pipeline": pipeline.as_dict()
        | {
            "configured_workers": configured_workers,
            "rank_workers": {str(n): w for n, w in sorted(rank_workers.items())},
            "storage": storage.as_dict(),
        },
        "compute": compute,
        "options": option_rows,
        "scaling": measured,
        "prediction": prediction,
        "sharing": shared.as_dict() if shared else None,
        "duration": plan.as_dict() | {"estimated_s": estimate_s, "took_s": took},
    }
    results["failed"] = failed_measurements(results)
    results["verdict"] = verdict(findings_from(results))
    return results


def finish(results: dict[str, Any], folder: Path) -> str:
    """Write ``bench.json`` and the plots into ``folder``; the table to print.

    The scaling plot only with a measured point (``report.plot_scaling``).
    """
    report.write_json(results, folder)
    if not report.plot_scaling(results, folder / "bench_scaling.png"):
        log.warning("no ddp run measured a step: no scaling plot (bench_scaling.png)")
    report.plot_pipeline(results, folder / "bench_pipeline.png")
    return report.table(results)


def device_counts(configured: Any, available: int) -> list[int]:
    """Device counts for the ddp runs: ``configured``, or 1, 2, 4, … and ``available``."""
    if configured:
        counts = sorted({int(n) for n in configured})
        if counts[0] < 1 or counts[-1] > available:
            raise ConfigError(
                f"bench.devices={counts} is not allowed: expected counts from 1 to {available} "
                "(the devices of this machine)"
            )
        return counts
    return doubling_counts(available)


def check_bench(options: DictConfig) -> None:
    """Raise ``ConfigError`` for a ``bench`` value that cannot work."""
    for name, minimum in (
        ("warmup_steps", 0),
        ("window_steps", 1),
        ("windows", 1),
        ("option_steps", 1),
        ("overhead_steps", 1),
        ("overhead_rounds", 1),
    ):
        require(
            options[name],
            f"bench.{name}",
            integer_at_least(minimum),
            f"an integer >= {minimum}",
        )
    for name in ("seconds", "timeout_s", "bucket_mb", "in_memory_gb"):
        require(
            options[name],
            f"bench.{name}",
            lambda v: isinstance(v, (int, float)) and v > 0,
            "a positive number",
        )
    if options.threads_per_process is not None:
        require(
            options.threads_per_process,
            "bench.threads_per_process",
            lambda v: isinstance(v, int) and v >= 1,
            "a positive integer, or null (the cores / the largest device count)",
        )
    require(
        options.predict_devices,
        "bench.predict_devices",
        lambda v: bool(v) and all(isinstance(n, int) and n >= 2 for n in v),
        "a list of device counts >= 2, such as [2, 4, 8]",
    )
