"""``python bench.py``: will more devices make this training faster, and by how much.

``bench`` composes the same config as ``train.py`` (``conf/bench.yaml`` extends
``conf/train.yaml`` with a ``bench`` section) and, for that config on this machine,
measures in turn: the data pipeline (``segscale.bench.pipeline``), one device's training
step in Lightning and in a bare PyTorch loop (``segscale.bench.compute``), the
performance options one at a time (``segscale.bench.options``), and short ``train.py``
runs with ``strategy=ddp`` on 1, 2, … devices (``segscale.bench.scaling``). From the
measured step it predicts 2, 4 and 8 devices over the interconnects of
``segscale.bench.interconnects`` (``segscale.bench.prediction``) and writes the verdict
(``segscale.bench.verdict``), a table, ``bench.json`` and two plots
(``segscale.bench.report``) into the run folder.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from tqdm import tqdm

from segscale.bench import report
from segscale.bench.compute import (
    BareLoopResult,
    StepPlan,
    autocast,
    framework_comparison,
    gradient_bytes,
    parameter_count,
)
from segscale.bench.interconnects import INTERCONNECTS, Interconnect
from segscale.bench.options import label, measure_option, option_variants
from segscale.bench.pipeline import doubling_counts, measure_pipeline, worker_counts
from segscale.bench.prediction import StepProfile, efficiency, predict, speedup
from segscale.bench.scaling import (
    SYNC_BATCHNORM,
    ScalingPoint,
    measure_allreduce,
    run_scaling_point,
    scaling_command,
    sync_batchnorm,
    without_key,
)
from segscale.bench.timing import Timing
from segscale.bench.verdict import findings_from, verdict
from segscale.checks import EXIT_BAD_INPUT, ConfigError, check_config, require
from segscale.cli.train import CONFIG_DIR, build, build_datamodule, build_module
from segscale.data.datamodule import cpus_available
from segscale.models.networks import check_input_side
from segscale.training.launch import resolve_accelerator

log = logging.getLogger(__name__)

TRAIN_SCRIPT = Path(CONFIG_DIR).parent / "train.py"


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
    ):
        require(
            options[name],
            f"bench.{name}",
            lambda v, m=minimum: isinstance(v, int) and v >= m,
            f"an integer >= {minimum}",
        )
    for name in ("seconds", "timeout_s", "bucket_mb"):
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


class Progress:
    """The progress bar: one tick per measurement, the latest one named beside it."""

    def __init__(self, total: int) -> None:
        self.bar = tqdm(total=total, desc="bench", file=sys.stderr, dynamic_ncols=True)

    def __call__(self, done: str) -> None:
        """One more measurement is done."""
        self.bar.update(1)
        self.bar.set_postfix_str(done)

    def close(self) -> None:
        """Remove the bar."""
        self.bar.close()


def bench(cfg: DictConfig, overrides: list[str]) -> dict[str, Any]:
    """Measure ``cfg`` on this machine, predict more devices; return ``bench.json``'s content.

    ``overrides`` are the command line's, passed on to the ``train.py`` runs.
    """
    check_config(cfg)
    check_input_side(cfg.datamodule.patch_size, "datamodule.patch_size", cfg.model)
    check_bench(cfg.bench)
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
    workers = worker_counts(cpus, configured_workers)
    if options.workers:  # the configured count is measured too: the verdict needs it
        workers = sorted({int(w) for w in options.workers} | {configured_workers})
    available = torch.cuda.device_count() if on_gpu else cpus
    counts = device_counts(options.devices, available)
    variants = option_variants(cfg, list(options.options or []), on_gpu)
    threads = None
    if not on_gpu:  # a CPU "device" is a process with its share of the cores, here too
        threads = options.threads_per_process or max(1, cpus // max(counts))
    scaling_runs = len(counts) + (max(counts) > 1)  # and sync batch norm flipped
    progress = Progress(1 + len(workers) + 1 + len(variants) + scaling_runs + 1)
    threads_before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        pipeline = measure_pipeline(datamodule, workers, options.seconds, progress)
        in_process = datamodule.train_dataloader(num_workers=0)
        batch = next(iter(in_process))
        module = build_module(cfg, datamodule, effective.learning_rate)
        plan = StepPlan(options.warmup_steps, options.window_steps, options.windows)
        trainer_options = {
            "accelerator": accelerator,
            "precision": cfg.trainer.precision,
            "benchmark": cfg.trainer.get("benchmark"),
            "log_every_n_steps": cfg.trainer.log_every_n_steps,
        }
        comparison = framework_comparison(module, batch, trainer_options, device, plan)
        bare, lightning = comparison.bare, comparison.lightning
        progress("compute")
        compute = {
            "device": torch.cuda.get_device_name(device) if on_gpu else f"CPU ({cpus} cores)",
            "threads": torch.get_num_threads() if not on_gpu else None,
            "batch": int(batch["image"].shape[0]),
            "precision": str(cfg.trainer.precision),
            "lightning": lightning.as_dict(),
            "bare": bare.as_dict(),
            "framework_ratio": comparison.ratio,
            "peak_memory_mb": comparison.peak_memory_mb,
            "memory_kind": "GPU, allocated" if on_gpu else "process peak RSS",
            "parameters": parameter_count(module),
            "gradient_bytes": gradient_bytes(module),
            "steps_per_epoch": len(in_process),
        }
        option_rows = measure_options(
            cfg, variants, datamodule, effective.learning_rate, batch, device, options, progress
        )
        measured, here = measure_scaling(
            cfg, overrides, counts, threads, compute, options, progress
        )
        data_rate = pipeline.loader[configured_workers]
        prediction = prediction_rows(bare, lightning, compute, data_rate, options, here, counts)
        progress("prediction")
    finally:
        progress.close()
        torch.set_num_threads(threads_before)
    results = {
        "config": {"overrides": overrides, "accelerator": accelerator, "cpus": cpus},
        "pipeline": pipeline.as_dict() | {"configured_workers": configured_workers},
        "compute": compute,
        "options": option_rows,
        "scaling": measured,
        "prediction": prediction,
    }
    results["verdict"] = verdict(findings_from(results))
    return results


def measure_options(
    cfg: DictConfig,
    variants: list[dict[str, Any]],
    datamodule: Any,
    learning_rate: float,
    batch: dict[str, torch.Tensor],
    device: torch.device,
    options: DictConfig,
    progress: Progress,
) -> list[dict[str, Any]]:
    """The bare step of the config as given and of each variant (one option changed)."""
    if not variants:
        return []
    plan = StepPlan(options.warmup_steps, options.option_steps, 1)

    def build_variant(variant: DictConfig) -> Any:
        return build_module(variant, datamodule, learning_rate)

    rows: list[dict[str, Any]] = []
    for overrides in [{}, *variants]:
        row: dict[str, Any] = {"option": label(overrides), "overrides": overrides, "error": None}
        try:
            result = measure_option(cfg, overrides, build_variant, batch, device, plan)
        # torch raises RuntimeError (its compiler and autocast errors derive from it) for
        # an option this machine lacks: reported in the table, the other options go on.
        except RuntimeError as error:
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        else:
            row |= {
                "step_s": result.step.mean_s,
                "peak_memory_mb": result.peak_memory_mb,
                "warmup_s": result.warmup_s,
            }
        rows.append(row)
        if overrides:
            progress(f"option {row['option']}")
    base = rows[0].get("step_s")
    for row in rows:
        row["speedup"] = base / row["step_s"] if base and row.get("step_s") else None
    return rows


def measure_scaling(
    cfg: DictConfig,
    overrides: list[str],
    counts: list[int],
    threads: int | None,
    compute: dict[str, Any],
    options: DictConfig,
    progress: Progress,
) -> tuple[dict[str, Any], Interconnect | None]:
    """The ddp runs for each of ``counts`` devices, and this machine's measured all-reduce.

    ``threads``: torch threads of each rank on CPUs (``None``: GPUs, one per rank).
    """
    folder = Path(cfg.output_dir) / "scaling"
    accelerator = "cpu" if threads else "cuda"
    plan = StepPlan(options.warmup_steps, options.window_steps, options.windows)
    sync = sync_batchnorm(overrides)
    runs = [(n, None) for n in counts]
    if max(counts) > 1:  # what synchronized batch norm costs, at the most devices
        runs.append((max(counts), f"strategy.sync_batchnorm={str(not sync).lower()}"))
    points: list[tuple[ScalingPoint, str | None]] = []
    for n, variant in runs:
        run_folder = folder / (f"devices_{n}" + ("_sync_batchnorm_flipped" if variant else ""))
        run_overrides = [*without_key(overrides, SYNC_BATCHNORM), variant] if variant else overrides
        command = scaling_command(
            TRAIN_SCRIPT, run_overrides, n, accelerator, plan.total, run_folder
        )
        log.info("scaling run: %s", " ".join(command))
        point = run_scaling_point(
            command, run_folder, n, threads, plan.warmup, plan.windows, options.timeout_s
        )
        points.append((point, variant))
        progress(f"ddp on {n} devices {variant or ''}" + (" (failed)" if point.error else ""))
    here = None
    if max(counts) > 1:
        bucket = int(min(compute["gradient_bytes"], options.bucket_mb * 2**20))
        here = measure_allreduce(max(counts), bucket, accelerator == "cuda")
    one = next((p.throughput for p, _ in points if p.devices == 1 and p.throughput), None)
    rows = []
    for point, variant in points:
        row = point.as_dict() | {"variant": variant}
        gain = speedup(point.throughput, one) if one and point.throughput else None
        row |= {"speedup": gain, "efficiency": efficiency(gain, point.devices) if gain else None}
        rows.append(row)
    per_device = f"{threads} thread(s) per process" if threads else "one GPU per process"
    measured = {"per_device": per_device, "threads": threads, "sync_batchnorm": sync}
    return measured | {"measured": rows}, here


def prediction_rows(
    bare: BareLoopResult,
    lightning: Timing,
    compute: dict[str, Any],
    data_rate: float,
    options: DictConfig,
    here: Interconnect | None,
    counts: list[int],
) -> dict[str, Any]:
    """Predicted speed-up on ``bench.predict_devices`` over each interconnect (and this one).

    The step is the Lightning run's, split into forward, backward and optimizer as the
    bare loop measured them; the data pipeline caps each device at ``data_rate`` (the
    configured workers' measured patches/s).
    """
    scale = lightning.mean_s / bare.step.mean_s
    profile = StepProfile(
        forward_s=bare.forward_s * scale,
        backward_s=bare.backward_s * scale,
        optimizer_s=bare.optimizer_s * scale,
        batch=compute["batch"],
        jitter=lightning.jitter,
    )
    rows = []
    links = [(link, list(options.predict_devices)) for link in INTERCONNECTS]
    if here is not None:
        links.append((here, [n for n in counts if n > 1]))
    for link, device_list in links:
        for n in device_list:
            prediction = predict(
                profile,
                compute["gradient_bytes"],
                n,
                link,
                bucket_bytes=options.bucket_mb * 2**20,
                data_rate_per_device=data_rate,
            )
            rows.append(prediction.as_dict())
    return {
        "profile": {
            "forward_s": profile.forward_s,
            "backward_s": profile.backward_s,
            "optimizer_s": profile.optimizer_s,
            "batch": profile.batch,
            "jitter": profile.jitter,
        },
        "data_rate_per_device": data_rate,
        "this_machine": here.name if here is not None else None,
        "one_device_throughput": min(profile.throughput, data_rate),
        "interconnects": [
            {
                "name": link.name,
                "bus_bandwidth": link.bus_bandwidth,
                "latency": link.latency,
                "source": link.source,
            }
            for link, _ in links
        ],
        "rows": rows,
    }


def finish(results: dict[str, Any], folder: Path) -> str:
    """Write ``bench.json`` and the plots into ``folder``; the table to print."""
    report.write_json(results, folder)
    report.plot_scaling(results, folder / "bench_scaling.png")
    report.plot_pipeline(results, folder / "bench_pipeline.png")
    return report.table(results)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="bench")
def run(cfg: DictConfig) -> None:
    """Benchmark the composed config; print the table, write the files (see module docstring)."""
    overrides = list(HydraConfig.get().overrides.task)
    try:
        results = bench(cfg, overrides)
    except ConfigError as error:
        log.error("%s", error)
        sys.exit(EXIT_BAD_INPUT)
    text = finish(results, Path(cfg.output_dir))
    log.info("bench results in %s", cfg.output_dir)
    print(text)


def main() -> None:
    """Entry point of ``bench.py``."""
    run()
