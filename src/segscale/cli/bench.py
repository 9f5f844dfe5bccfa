"""``python bench.py``: will more devices make this training faster, and by how much.

``bench`` composes the same config as ``train.py`` (``conf/bench.yaml`` extends
``conf/train.yaml`` with a ``bench`` section) and, for that config on this machine,
measures in turn: the data pipeline (``segscale.bench.pipeline``), one device's training
step in Lightning and in a bare PyTorch loop (``segscale.bench.compute``), DDP's gradient
buckets (``segscale.bench.gradients``), FLOPs (``segscale.bench.flops``), the framework's
overhead per step (``segscale.bench.overhead``), the performance options one at a time
(``segscale.bench.options``), short ``train.py`` runs with ``strategy=ddp`` on 1, 2, …
devices (``segscale.bench.scaling``) and, on CPUs, N loops side by side
(``segscale.bench.sharing``). From these the step model (``segscale.bench.prediction``)
predicts 2, 4 and 8 devices over the interconnects of ``segscale.bench.interconnects``
and this machine's N; the verdict (``segscale.bench.verdict``), a table, ``bench.json``
and two plots (``segscale.bench.report``) go into the run folder.
"""

from __future__ import annotations

import copy
import logging
import sys
from dataclasses import asdict, dataclass
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
from segscale.bench.flops import measure_utilisation
from segscale.bench.gradients import measure_gradients
from segscale.bench.interconnects import INTERCONNECTS, Interconnect
from segscale.bench.options import label, measure_option, option_variants
from segscale.bench.overhead import measure_overhead
from segscale.bench.pipeline import doubling_counts, measure_pipeline, worker_counts
from segscale.bench.prediction import (
    GPU_COLLECTIVE_SKEW_S,
    GPU_HOST_SYNC_SKEW_S,
    SYNC_BATCHNORM_COLLECTIVES,
    BatchNormSync,
    Collectives,
    Gradients,
    Host,
    StepProfile,
    efficiency,
    expected_max_standard_normal,
    predict,
    speedup,
)
from segscale.bench.scaling import (
    SYNC_BATCHNORM,
    ScalingPoint,
    measure_allreduce,
    run_scaling_point,
    scaling_command,
    sync_batchnorm,
    without_key,
)
from segscale.bench.sharing import Sharing, batchnorm_layers, sharing, side_by_side
from segscale.bench.timing import Timing
from segscale.bench.verdict import findings_from, verdict
from segscale.configs import CONFIG_DIR
from segscale.devices import cpus_available, resolve_accelerator
from segscale.errors import EXIT_BAD_INPUT, ConfigError, require
from segscale.models.networks import check_input_side
from segscale.training.builders import build, build_datamodule, build_module
from segscale.training.config_checks import check_config

log = logging.getLogger(__name__)


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
    threads = None
    if not on_gpu:  # a CPU "device" is a process with its share of the cores, here too
        threads = options.threads_per_process or max(1, cpus // max(counts))
    scaling_runs = len(counts) + (max(counts) > 1)  # and sync batch norm flipped
    side_by_side_runs = 2 if threads and max(counts) > 1 else 0
    progress = Progress(1 + len(workers) + 3 + len(variants) + scaling_runs + side_by_side_runs + 1)
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
            "buffer_bytes": buffer_bytes(module),
            "batchnorm_layers": len(norms),
            "batchnorm_channels": sum(m.num_features for m in norms),
            "buckets": list(gradients.buckets),
            "bucket_ready": list(gradients.ready),
            "steps_per_epoch": len(in_process),
            "overhead": overhead.as_dict(),
            "flops": flops.as_dict(),
        }
        option_rows = measure_options(
            cfg, variants, datamodule, effective.learning_rate, batch, device, options, progress
        )
        measured, here = measure_scaling(
            cfg, overrides, counts, threads, compute, options, progress
        )
        shared = None
        if side_by_side_runs:
            plan_steps = (options.warmup_steps, options.window_steps)
            alone = side_by_side(cfg, 1, threads, *plan_steps)
            progress("one loop alone")
            together = side_by_side(cfg, max(counts), threads, *plan_steps)
            progress(f"{max(counts)} loops side by side")
            shared = sharing(alone, together)
        rates = {n: rank_data_rate(pipeline.loader[w], n, w, cpus) for n, w in rank_workers.items()}
        one = next((r for r in measured["measured"] if r["devices"] == 1 and r["timing"]), None)
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
        prediction = prediction_rows(inputs, options, here, counts, on_gpu)
        progress("prediction")
    finally:
        progress.close()
        torch.set_num_threads(threads_before)
    results = {
        "config": {"overrides": overrides, "accelerator": accelerator, "cpus": cpus},
        "pipeline": pipeline.as_dict()
        | {
            "configured_workers": configured_workers,
            "rank_workers": {str(n): w for n, w in sorted(rank_workers.items())},
        },
        "compute": compute,
        "options": option_rows,
        "scaling": measured,
        "prediction": prediction,
        "sharing": shared.as_dict() if shared else None,
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
        command = scaling_command(run_overrides, n, accelerator, plan.total, run_folder)
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


def rank_data_rate(loader_rate: float, ranks: int, workers: int, cpus: int) -> float:
    """Patches/s one rank's workers deliver when ``ranks`` ranks share ``cpus`` cores.

    ``loader_rate`` is one process's measured rate with ``workers`` workers; when the
    ranks' processes and workers together outnumber the cores, each gets its share.
    """
    return loader_rate * min(1.0, cpus / (ranks * (workers + 1)))


def buffer_bytes(module: torch.nn.Module) -> int:
    """Bytes of the module's buffers: what DDP broadcasts from rank 0 every forward."""
    return sum(b.numel() * b.element_size() for b in module.buffers())


@dataclass(frozen=True)
class ModelInputs:
    """What bench measured that the step model needs."""

    bare: BareLoopResult
    lightning: Timing
    compute: dict[str, Any]
    gradients: Gradients
    data_rates: dict[int, float]  # ranks → patches/s of each rank's workers
    sharing: Sharing | None  # CPU ranks side by side (None on GPUs)
    sync_batchnorm: bool  # the ddp runs' setting
    one_device_s: float | None  # the 1-device ddp run's mean step, when it ran

    def profile(self) -> StepProfile:
        """One device's step as ``train.py`` runs it, split as the bare loop measured it.

        The step is the 1-device ddp run's (data loading, DDP's wrapper and the
        framework included), else the in-memory Lightning step's; less the framework's
        measured overhead, it is split into forward, backward and optimizer in the bare
        loop's proportions.
        """
        overhead = max(0.0, self.compute["overhead"]["overhead_ms"] / 1000)
        step = self.one_device_s or self.lightning.mean_s
        scale = max(step - overhead, 0.5 * step) / self.bare.step.mean_s
        return StepProfile(
            forward_s=self.bare.forward_s * scale,
            backward_s=self.bare.backward_s * scale,
            optimizer_s=self.bare.optimizer_s * scale,
            batch=self.compute["batch"],
            jitter=self.lightning.jitter,
            overhead_s=overhead,
        )

    def batchnorm(self, synchronized: bool, compute_s: float = 0.0) -> BatchNormSync | None:
        """Segscale's synchronized batch norm of this network (``None`` when off)."""
        layers = self.compute["batchnorm_layers"]
        if not synchronized or not layers:
            return None
        channels = self.compute["batchnorm_channels"] / layers
        forward, backward, host_syncs = SYNC_BATCHNORM_COLLECTIVES["segscale"]
        message = (2 * channels + 1) * 8  # sums, squared deviations and the count, float64
        return BatchNormSync(layers, message, forward, backward, host_syncs, compute_s)

    def collectives(self) -> Collectives:
        """DDP's buffer broadcast and the loss normaliser's all-reduce."""
        return Collectives.ddp(self.compute["buffer_bytes"])


def prediction_rows(
    inputs: ModelInputs,
    options: DictConfig,
    here: Interconnect | None,
    counts: list[int],
    on_gpu: bool,
) -> dict[str, Any]:
    """Predicted speed-up on ``bench.predict_devices`` over each interconnect (and this one).

    GPU interconnects: each rank its own device, ranks meeting with the published spreads
    (``GPU_COLLECTIVE_SKEW_S``, ``GPU_HOST_SYNC_SKEW_S``), synchronized batch norm as the
    ddp runs have it. This machine: its measured all-reduce curve, and on CPUs what the
    ranks measured side by side (slowdown, sync-point cost, batch norm's arithmetic),
    with synchronized batch norm on and off, to set beside the measured ddp runs.
    """
    profile = inputs.profile()
    rate_1 = inputs.data_rates[1]
    gpu_host = Host(skew_s=GPU_COLLECTIVE_SKEW_S, host_sync_skew_s=GPU_HOST_SYNC_SKEW_S)
    rows = []
    for link in INTERCONNECTS:
        for n in options.predict_devices:
            prediction = predict(
                profile,
                inputs.gradients,
                n,
                link,
                gpu_host,
                inputs.batchnorm(inputs.sync_batchnorm),
                inputs.collectives(),
                data_rate_1=rate_1,
                data_rate_n=inputs.data_rates[n],
            )
            rows.append(prediction.as_dict())
    here_rows = []
    if here is not None:
        # CPU ranks: only the N the side-by-side loops measured (slowdown and sync points
        # depend on N); GPUs: every measured N.
        measured_n = [n for n in counts if n > 1]
        if inputs.sharing is not None and not on_gpu:
            measured_n = [inputs.sharing.devices]
        here_rows = [
            this_machine(inputs, here, n, synchronized, on_gpu) | {"sync_batchnorm": synchronized}
            for n in measured_n
            for synchronized in (True, False)
        ]
    return {
        "profile": asdict(profile),
        "data_rates": {str(n): rate for n, rate in sorted(inputs.data_rates.items())},
        "one_device_throughput": min(profile.throughput, rate_1),
        "gpu_skew_s": {"collective": GPU_COLLECTIVE_SKEW_S, "host_sync": GPU_HOST_SYNC_SKEW_S},
        "interconnects": [
            {
                "name": link.name,
                "bus_bandwidth": link.bus_bandwidth,
                "latency": link.latency,
                "source": link.source,
            }
            for link in [*INTERCONNECTS, *([here] if here else [])]
        ],
        "rows": rows,
        "this_machine": here.name if here is not None else None,
        "this_machine_rows": here_rows,
    }


def this_machine(
    inputs: ModelInputs, link: Interconnect, n: int, synchronized: bool, on_gpu: bool
) -> dict[str, Any]:
    """The prediction for ``n`` ranks of this machine, batch norm ``synchronized`` or not."""
    shared = inputs.sharing
    host, extra = Host(skew_s=GPU_COLLECTIVE_SKEW_S, host_sync_skew_s=GPU_HOST_SYNC_SKEW_S), 0.0
    if shared is not None and not on_gpu:
        wait = expected_max_standard_normal(shared.devices)
        skew = max(0.0, shared.sync_point_s - link.latency) / wait
        host = Host(slowdown=shared.slowdown, overlap=False, skew_s=skew, host_sync_skew_s=skew)
        extra = shared.sync_batchnorm_compute_s / shared.slowdown
    prediction = predict(
        inputs.profile(),
        inputs.gradients,
        n,
        link,
        host,
        inputs.batchnorm(synchronized, extra),
        inputs.collectives(),
        data_rate_1=inputs.data_rates[1],
        data_rate_n=inputs.data_rates[n],
    )
    return prediction.as_dict()


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
