"""The verdict: one plain paragraph from the measured and predicted numbers.

It opens with the measurements that failed, if any, each with its error: what follows is
made without them. GPU predictions exist only where bench measured a GPU, and the
verdict says what they are built from (the step measured on that GPU); where it measured
a CPU it says that it has no basis for a GPU's step and predicts none, and names no
bottleneck beyond the data pipeline. The rules, in order: the data pipeline is the
bottleneck when the configured workers deliver fewer patches/s than one device consumes;
communication is, when the predicted efficiency on ``max(predict_devices)`` devices over
PCIe falls below ``GOOD_EFFICIENCY``; otherwise compute is. Communication is named by
the largest term of the predicted step (synchronized batch norm, the gradient all-reduce
past the backward pass, the other collectives, the slowest rank, the framework's fixed
cost), and what to change first follows that term, with the prediction it would give:
``training.sync_batchnorm=false`` (and what it costs: statistics over each device's own
batch), a larger per-device batch, a faster link. Data: workers; compute: the fastest
measured option (precision, channels_last, compile). Then what limits scaling, each with
its number: the FLOP/s of one device's step (on a GPU of the table, its share of the
peak); on this machine what N processes lose side by side and what synchronized batch
norm, the gradient all-reduce and the slowest rank add per step; on GPUs the largest
cost beyond compute, and the arrival spread the GPU collectives are costed with, its
source, and what the other spread model would predict. Warnings follow: measured scaling
well below the prediction, synchronized batch norm that costs more than 15%, epochs too
short for many devices, framework overhead.

Where the GPU ranks would use gloo (Windows, or ``strategy.process_group_backend=gloo``),
the verdict is made from the prediction over gloo's link through host memory, on the
GPUs this machine has (at least 2): communication is the bottleneck when that efficiency
falls below ``GOOD_EFFICIENCY``, named by the largest term of the gloo step (the gradient
all-reduce through host memory, with what the step's gradients spend copied to the host,
in gloo's host all-reduce and copied back; synchronized batch norm, each of whose
collectives is a host sync under gloo), and the verdict says what NCCL on Linux or WSL2
would give for the same config and devices over PCIe 3.0, PCIe 5.0 and NVLink.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GOOD_EFFICIENCY = 0.75
"""Predicted efficiency below which communication is called the bottleneck."""

MIN_STEPS_PER_EPOCH = 10
"""Fewer steps than this per rank and epoch: start-up, validation and epoch ends dominate."""

FRAMEWORK_TOLERANCE = 1.03
"""Lightning's step may take this many times the bare loop's before the verdict says so."""

SYNC_BATCHNORM_TOLERANCE = 1.15
"""Turning synchronized batch norm off must gain this much before the verdict says so."""

PCIE = "PCIe 5.0 x16"
NVLINK = "NVLink H100"
NCCL_LINKS = ("PCIe 3.0 x16", PCIE, NVLINK)
"""The NCCL rows the verdict sets beside a gloo prediction: the slowest PCIe to NVLink."""


@dataclass(frozen=True)
class Findings:
    """The numbers the verdict is made of (patches/s unless said otherwise)."""

    batch: int  # per device
    compute_rate: float  # one device, Lightning step, data in memory
    pipeline_rate: float  # the configured DataLoader workers
    workers: int  # the configured workers per rank
    best_workers: int
    best_pipeline_rate: float
    framework_ratio: float  # Lightning step / bare-loop step
    steps_per_epoch: int  # on one device
    most_devices: int  # the most devices bench predicts (bench.predict_devices)
    # Interconnect → devices → efficiency: GPU predictions, only where bench measured a GPU
    predicted: dict[str, dict[int, float]]
    measured: dict[int, float] = field(default_factory=dict)  # devices → efficiency (N ≥ 2)
    predicted_here: dict[int, float] = field(default_factory=dict)  # this machine's link
    best_option: tuple[str, float] | None = None  # overrides, speed-up of the step
    # Devices, and throughput without / with synchronized batch norm there (when it is on)
    sync_batchnorm_gain: tuple[int, float] | None = None
    # The largest N of this machine, as predicted with the configured batch norm: its terms
    here_terms: dict[str, float] | None = None
    # The most devices over NVLink, then over PCIe: the step's terms (bench.json's rows,
    # with the prediction without synchronized batch norm and under the other spread)
    gpu_terms: dict[str, Any] | None = None
    pcie_terms: dict[str, Any] | None = None
    spread: dict[str, Any] | None = None  # bench.json's prediction.arrival_spread
    flops_per_s: float | None = None  # achieved by one device's step
    peak_fraction: float | None = None  # of the device's peak (GPUs of the table)
    device: str = ""
    flops_per_patch: float | None = None  # forward + backward
    # What the GPU predictions are built from (bench.json's prediction.gpu_basis)
    gpu_basis: dict[str, Any] | None = None
    # Measurements that failed: (what, its error, its output's file in the run folder)
    failed: tuple[tuple[str, str, str | None], ...] = ()
    # GPU ranks under gloo: why (bench.json's prediction.gpu_backend.reason), and the
    # gloo row on this machine's GPUs (at least 2) with its gloo_parts
    gloo_reason: str | None = None
    gloo_terms: dict[str, Any] | None = None


def bottleneck(findings: Findings) -> str | None:
    """``data``, ``communication`` or ``compute``: what limits training (module docstring).

    ``None``: the data pipeline keeps up and there is no GPU prediction to tell the rest.
    """
    if findings.pipeline_rate < findings.compute_rate:
        return "data"
    if not findings.predicted:
        return None
    if findings.gloo_terms is not None:  # what these GPUs get under gloo, through host memory
        return "communication" if findings.gloo_terms["efficiency"] < GOOD_EFFICIENCY else "compute"
    most = max(findings.predicted[PCIE])
    if findings.predicted[PCIE][most] < GOOD_EFFICIENCY:
        return "communication"
    return "compute"


def verdict(findings: Findings) -> str:
    """The paragraph: bottleneck, whether more devices help and by how much, what to change."""
    f = findings
    kind = bottleneck(f)
    sentences = [*failures(f)]
    sentences += [
        f"One device trains {f.compute_rate:.1f} patches/s (batch {f.batch}); "
        f"{f.workers} DataLoader worker(s) deliver {f.pipeline_rate:.1f} patches/s."
    ]
    if kind == "data":
        sentences.append(
            f"The bottleneck is the data pipeline: the device waits for patches, and more "
            f"devices will not help until each rank's workers keep up. Change first "
            f"datamodule.num_workers (measured best: {f.best_workers} workers, "
            f"{f.best_pipeline_rate:.1f} patches/s"
            + (
                ")."
                if f.best_pipeline_rate >= f.compute_rate
                else "; still short: cheaper augmentation or smaller patches)."
            )
        )
    elif f.gloo_terms is not None and kind is not None:
        sentences += through_host(f, kind == "communication")
    elif kind == "communication":
        sentences += communication(f)
    elif kind is None:
        sentences.append(f"The data pipeline keeps up with this machine's {f.device}.")
        sentences += options_advice(f)
    else:
        most = max(f.predicted[PCIE])
        nvlink, pcie = f.predicted[NVLINK][most], f.predicted[PCIE][most]
        sentences.append(
            f"The bottleneck is compute, so more devices help: on {most} devices expect "
            f"{most * nvlink:.1f}× ({nvlink:.0%} efficiency) over {NVLINK} and "
            f"{most * pcie:.1f}× ({pcie:.0%}) over {PCIE}."
        )
        sentences += options_advice(f)
    sentences += gpu_basis(f)
    sentences += limits(f, gpu=kind != "communication")
    sentences += spread_assumption(f)
    sentences += warnings(f)
    return " ".join(sentences)


def failures(findings: Findings) -> list[str]:
    """The measurements that failed, each with its error and where its output is."""
    failed = findings.failed
    if not failed:
        return []
    listed = "; ".join(
        f"{what} ({error}" + (f"; its output: {output})" if output else ")")
        for what, error, output in failed
    )
    them = "it" if len(failed) == 1 else "them"
    text = (
        f"{len(failed)} of bench's measurements failed, and what follows is made without "
        f"{them}: {listed}."
    )
    if any(what == ONE_DEVICE_RUN for what, _, _ in failed):
        text += (
            " Without the 1-device train.py run the prediction starts from bench's own step "
            "(data in memory)."
        )
    return [text]


def options_advice(findings: Findings) -> list[str]:
    """What to change first on this device: the fastest option measured, else the batch."""
    f = findings
    if f.best_option and f.best_option[1] > 1.1:
        return [
            f"Change first {f.best_option[0]}: measured {f.best_option[1]:.2f}× faster "
            f"per step on this device."
        ]
    if f.best_option:
        return [
            "No measured option (precision, channels_last, compile) gains more than "
            "10% here; a larger per-device batch uses the device better."
        ]
    return [
        "A larger per-device batch uses the device better (no speed option was "
        "measured: bench.options=[])."
    ]


def gpu_basis(findings: Findings) -> list[str]:
    """What the GPU predictions are built from; where bench measured no GPU, why there are none."""
    f = findings
    if f.predicted:
        basis = f.gpu_basis
        if not basis:  # a bench.json from before the basis was recorded
            return []
        return [
            f"The GPU predictions are built from the step measured here on one "
            f"{basis['device']} ({1000 * basis['step_s']:.1f} ms for {f.batch} patches, "
            f"{basis['step']}): each row is N of these GPUs over its interconnect; for "
            f"another GPU, run bench.py on one."
        ]
    flops = (
        f"its {f.flops_per_patch / 1e9:.2f} GFLOP per patch give"
        if f.flops_per_patch
        else "a step's FLOPs give"
    )
    return [
        f"GPUs are not predicted: bench measured {f.device}, not a GPU, and has no basis for "
        f"this config's step on one (it holds no published step time of this config, "
        f"{flops} a GPU's step only at a share of that GPU's peak that bench has not "
        f"measured, and a CPU's step is not a GPU's). To know what N GPUs give, run "
        f"bench.py on a machine with one GPU of the kind to train on."
    ]


ONE_DEVICE_RUN = "ddp on 1 device"
"""The scaling run whose step the step model starts from (``failed_measurements``' name)."""


def failed_measurements(results: dict[str, Any]) -> list[dict[str, Any]]:
    """bench.json's measurements that failed: what, its error, its output's file if any."""
    failed: list[dict[str, Any]] = []
    for row in results["scaling"]["measured"]:
        if row["error"]:
            what = ONE_DEVICE_RUN if row["devices"] == 1 else f"ddp on {row['devices']} devices"
            what += f", {row['variant']}" if row["variant"] else ""
            failed.append(
                {"measurement": what, "error": row["error"], "output": row.get("console")}
            )
    for row in results["options"]:
        if row["error"]:
            what = f"the bare step, {row['option']}"
            failed.append({"measurement": what, "error": row["error"], "output": None})
    return failed


TERMS = {
    "sync_batchnorm_s": "synchronized batch norm",
    "exposed_communication_s": "the gradient all-reduce past the backward pass",
    "collectives_s": "the loss normaliser's and DDP's buffer collectives",
    "straggler_s": "waiting for the slowest rank",
    "overhead_s": "the framework's fixed cost",
}
"""The terms of the predicted step beyond compute, by the names the verdict gives them."""


GLOO_TERMS = TERMS | {
    "sync_batchnorm_s": "synchronized batch norm through host memory",
    "exposed_communication_s": "the gradient all-reduce through host memory past the backward pass",
    "collectives_s": "the loss normaliser's and DDP's buffer collectives through host memory",
}
"""``TERMS`` as the verdict names them for GPU ranks under gloo (each collective via the host)."""


def _largest(terms: dict[str, Any]) -> tuple[str, float]:
    """The key of the largest term of ``terms`` beyond compute, and its seconds."""
    key = max(TERMS, key=lambda name: terms.get(name, 0.0))
    return key, terms.get(key, 0.0)


def through_host(findings: Findings, communication_bound: bool) -> list[str]:
    """GPU ranks under gloo: the gloo step's largest term, NCCL's rows beside it, the lever."""
    f = findings
    terms = f.gloo_terms
    assert terms is not None  # verdict() calls this only with a gloo row
    n = int(terms["devices"])
    key, seconds = _largest(terms)
    backend = (
        f"these GPUs' ranks would use gloo ({f.gloo_reason}), which copies every all-reduce "
        f"to host memory, all-reduces it there between the processes and copies it back"
    )
    if communication_bound:
        slower = ", slower than one GPU" if terms["speedup"] < 1 else ""
        sentences = [
            f"The bottleneck is communication through host memory: {backend}; on {n} GPUs "
            f"{GLOO_TERMS[key]} takes {1000 * seconds:.1f} ms of a "
            f"{1000 * terms['step_s']:.0f} ms step{_gloo_detail(terms, key)}, which leaves "
            f"{_rate(terms['efficiency'], n)}{slower}."
        ]
    else:
        sentences = [
            f"The bottleneck is compute, so more devices help even though {backend}: on {n} "
            f"GPUs expect {_rate(terms['efficiency'], n)}, the largest cost beyond compute "
            f"being {GLOO_TERMS[key]} ({1000 * seconds:.1f} ms of {1000 * terms['step_s']:.0f})."
        ]
    sentences += _nccl_beside(f, n)
    if not communication_bound:
        return sentences + options_advice(f)
    return [*sentences, _gloo_lever(f, terms, key)]


def _nccl_beside(findings: Findings, n: int) -> list[str]:
    """What NCCL's rows (``NCCL_LINKS``) predict for the same config on ``n`` GPUs."""
    predicted = findings.predicted
    each = [
        f"{_rate(predicted[link][n], n)} over {link}"
        for link in NCCL_LINKS
        if n in predicted.get(link, {})
    ]
    if not each:
        return []
    rates = " and ".join([", ".join(each[:-1]), each[-1]] if len(each) > 1 else each)
    return [
        f"With NCCL (on Linux, or in WSL2 on this machine) the same config on {n} GPUs "
        f"would reach {rates}."
    ]


def _gloo_lever(findings: Findings, terms: dict[str, Any], key: str) -> str:
    """What to change first under gloo: batch norm off where it is the largest, else NCCL."""
    n, batch = int(terms["devices"]), findings.batch
    off = terms.get("without_sync_batchnorm")
    if key == "sync_batchnorm_s" and off:
        return (
            f"Change first training.sync_batchnorm=false: predicted {_rate(off['efficiency'], n)} "
            f"under gloo; what it costs: each device's batch-norm statistics come from its "
            f"own {batch} patches instead of {batch} × {n} = {batch * n}. Or train with NCCL "
            f"(WSL2 or Linux)."
        )
    return (
        "Change first the backend: train with NCCL (WSL2 or Linux). Under gloo, a larger "
        "per-device batch (datamodule.batch_size): that cost stays the same while the "
        "compute per step grows."
    )


def _gloo_detail(terms: dict[str, Any], key: str) -> str:
    """What the named gloo term is made of, in parentheses (its parts, or its host syncs)."""
    parts = terms.get("gloo_parts")
    if key == "exposed_communication_s" and parts:
        return (
            f" (the step's gradients spend {1000 * parts['device_to_host_s']:.1f} ms copied to "
            f"the host, {1000 * parts['host_allreduce_s']:.1f} ms in gloo's host all-reduce "
            f"and {1000 * parts['host_to_device_s']:.1f} ms copied back; what runs beside the "
            f"backward pass is hidden)"
        )
    if key == "sync_batchnorm_s":
        return " (two collectives per batch-norm layer, each a host sync under gloo)"
    return ""


def _rate(efficiency: float, devices: int) -> str:
    return f"{efficiency:.0%} ({devices * efficiency:.1f}×)"


def communication(findings: Findings) -> list[str]:
    """The bottleneck named by the largest term of the PCIe step, and its levers in numbers."""
    f = findings
    most = max(f.predicted[PCIE])
    nvlink, pcie = f.predicted[NVLINK][most], f.predicted[PCIE][most]
    efficiencies = (
        f"an expected efficiency of {_rate(pcie, most)} over {PCIE} and "
        f"{_rate(nvlink, most)} over {NVLINK}"
    )
    terms = f.pcie_terms
    if not terms:  # a bench.json without the rows' terms: the all-reduce, as it was
        return [
            f"The bottleneck is communication: on {most} devices, {efficiencies}. Change "
            f"first the per-device batch (datamodule.batch_size), then the interconnect."
        ]
    key, seconds = _largest(terms)
    text = (
        f"The bottleneck is communication: on {most} devices {TERMS[key]} takes "
        f"{1000 * seconds:.1f} ms of a {1000 * terms['step_s']:.0f} ms step over {PCIE}"
    )
    if f.gpu_terms:
        text += (
            f" ({1000 * f.gpu_terms.get(key, 0.0):.1f} ms of "
            f"{1000 * f.gpu_terms['step_s']:.0f} over {NVLINK})"
        )
    sentences = [f"{text}, which leaves {efficiencies}."]
    batch_lever = "a larger per-device batch (datamodule.batch_size: that cost stays the same "
    batch_lever += "while the compute per step grows)"
    if key == "sync_batchnorm_s":
        sentences.append(_without_sync_batchnorm(f, most, "Change first") + f" Or {batch_lever}.")
    elif key == "exposed_communication_s":
        sentences.append(f"Change first {batch_lever}, then the interconnect.")
    elif key == "straggler_s":
        sentences.append(
            "Change first what makes the ranks' steps uneven (data loading stalls, varying "
            f"shapes), then {batch_lever}."
        )
    else:
        sentences.append(f"Change first {batch_lever}.")
    return sentences


def _without_sync_batchnorm(findings: Findings, devices: int, lead: str) -> str:
    """The prediction with ``training.sync_batchnorm=false`` over both links, and its cost."""
    f = findings
    offs = [
        (link, terms["without_sync_batchnorm"]["efficiency"])
        for link, terms in ((PCIE, f.pcie_terms), (NVLINK, f.gpu_terms))
        if terms and terms.get("without_sync_batchnorm")
    ]
    predicted = " and ".join(f"{_rate(off, devices)} over {link}" for link, off in offs)
    return (
        f"{lead} training.sync_batchnorm=false: predicted {predicted}; what it costs: "
        f"each device's batch-norm statistics come from its own {f.batch} patches instead "
        f"of {f.batch} × {devices} = {f.batch * devices}."
    )


def spread_assumption(findings: Findings) -> list[str]:
    """The arrival spread the GPU predictions assume, its source, and the other model's."""
    gpu, spread = findings.gpu_terms, findings.spread
    if not gpu or not spread or gpu.get("sync_batchnorm_s", 0.0) + gpu["collectives_s"] <= 0:
        return []
    used, other = spread["used"], spread["alternative"]
    text = (
        f"The GPU predictions cost each collective as its all-reduce plus the wait for the "
        f"latest of the ranks, which are assumed to arrive {1000 * used['collective_s']:.3f} "
        f"ms apart (std, the {used['name']} spread model, {used['source']})"
    )
    alternative = gpu.get("other_spread")
    if alternative:
        text += (
            f"; with a spread of {other['collective']:.1%} of the compute between two sync "
            f"points instead ({1000 * other['collective_s']:.3f} ms here; the {other['name']} "
            f"model, which fits the published rows worse), {int(gpu['devices'])} GPUs over "
            f"{NVLINK} would reach {_rate(alternative['efficiency'], int(gpu['devices']))} "
            f"with synchronized batch norm taking "
            f"{1000 * alternative['sync_batchnorm_s']:.1f} ms"
        )
    return [text + "."]


def limits(findings: Findings, gpu: bool = True) -> list[str]:
    """Sentences naming what limits scaling, each with its number (this machine, then GPUs).

    ``gpu`` False leaves out the GPUs' largest cost (the communication verdict named it).
    """
    f, notes = findings, []
    if f.flops_per_s:
        text = f"One device's step runs {f.flops_per_s / 1e9:.1f} GFLOP/s"
        if f.peak_fraction is not None:
            text += f": compute-bound at {f.peak_fraction:.0%} of the {f.device}'s peak"
        notes.append(text + ".")
    here = f.here_terms
    if here:
        n, slowdown = int(here["devices"]), here["slowdown"]
        text = (
            f"On this machine {n} processes share the host: independent loops alone run "
            f"{slowdown:.2f}× slower side by side, so {n} processes reach at most "
            f"{n / slowdown:.2f}×"
        )
        if here.get("sync_batchnorm_s", 0.0) > 0:
            text += (
                f"; synchronized batch norm costs a further "
                f"{1000 * here['sync_batchnorm_s']:.0f} ms per step"
            )
        text += (
            f", the gradient all-reduce {1000 * here['exposed_communication_s']:.0f} ms and "
            f"waiting for the slower rank {1000 * here['straggler_s']:.0f} ms, of a predicted "
            f"{1000 * here['step_s']:.0f} ms step."
        )
        notes.append(text)
    terms = f.gpu_terms
    if terms and gpu:
        key, seconds = _largest(terms)
        devices = int(terms["devices"])
        notes.append(
            f"On {devices} GPUs over {NVLINK} the largest cost beyond compute would be "
            f"{TERMS[key]}: {1000 * seconds:.1f} ms of a {1000 * terms['step_s']:.0f} ms step."
        )
        if key == "sync_batchnorm_s" and terms.get("without_sync_batchnorm"):
            notes.append(_without_sync_batchnorm(f, devices, "Without it,"))
    return notes


def warnings(findings: Findings) -> list[str]:
    """Sentences on what else the numbers show (scaling gap, short epochs, overhead)."""
    f, notes = findings, []
    for devices, measured in sorted(f.measured.items()):
        expected = f.predicted_here.get(devices)
        if expected is not None and measured < expected - 0.15:
            notes.append(
                f"Measured on {devices} devices of this machine: {measured:.0%} efficiency, "
                f"below the predicted {expected:.0%}: a cost the step model does not have "
                f"(its terms are in bench.json, prediction.this_machine_rows)."
            )
        elif expected is not None:
            notes.append(
                f"Measured on {devices} devices of this machine: {measured:.0%} efficiency "
                f"(predicted {expected:.0%})."
            )
    if f.sync_batchnorm_gain and f.sync_batchnorm_gain[1] > SYNC_BATCHNORM_TOLERANCE:
        devices, gain = f.sync_batchnorm_gain
        notes.append(
            f"Synchronized batch norm is expensive here: training.sync_batchnorm=false measured "
            f"{gain:.2f}× the throughput on {devices} devices (each device's statistics then "
            f"come from its own {f.batch} patches)."
        )
    most = f.most_devices
    if f.steps_per_epoch / most < MIN_STEPS_PER_EPOCH:
        notes.append(
            f"An epoch is {f.steps_per_epoch} steps on one device, {f.steps_per_epoch / most:.1f} "
            f"on each of {most}: epoch start, validation and checkpoints will dominate; draw "
            f"more patches per image (datamodule.patches_per_image) before adding devices."
        )
    if f.framework_ratio > FRAMEWORK_TOLERANCE:
        notes.append(
            f"Lightning's step takes {f.framework_ratio:.2f}× the bare PyTorch loop's "
            f"(logging and bookkeeping); at this step length that is visible."
        )
    return notes


def findings_from(results: dict[str, Any]) -> Findings:
    """The verdict's numbers, read from ``bench.json``'s content."""
    pipeline = results["pipeline"]
    loader = {int(workers): rate for workers, rate in pipeline["loader"].items()}
    workers = pipeline["configured_workers"]
    best_workers = max(loader, key=loader.__getitem__)
    compute, prediction = results["compute"], results["prediction"]
    gpu_rows = _gpu_rows(results)
    predicted: dict[str, dict[int, float]] = {}
    for row in gpu_rows:
        predicted.setdefault(row["interconnect"], {})[row["devices"]] = row["efficiency"]
    rows = results["scaling"]["measured"]
    configured = results["scaling"]["sync_batchnorm"]
    here_rows = [
        row for row in prediction["this_machine_rows"] if row["sync_batchnorm"] == configured
    ]
    predicted_here = {row["devices"]: row["efficiency"] for row in here_rows}
    here_terms = None
    if here_rows and results.get("sharing"):
        here_terms = dict(max(here_rows, key=lambda row: row["devices"]))
        here_terms["slowdown"] = results["sharing"]["slowdown"]
    most = max(prediction.get("devices") or [row["devices"] for row in prediction["rows"]])
    gpu_terms, pcie_terms = (
        next((r for r in gpu_rows if r["interconnect"] == link and r["devices"] == most), None)
        for link in (NVLINK, PCIE)
    )
    gloo_reason, gloo_terms = _gloo_row(results, rows)
    flops = compute.get("flops") or {}
    measured = {
        row["devices"]: row["efficiency"]
        for row in rows
        if row["devices"] > 1 and row["efficiency"] is not None and not row["variant"]
    }
    sync_gain = None
    flipped = next((row for row in rows if row["variant"] and row["throughput"]), None)
    if flipped and results["scaling"]["sync_batchnorm"]:
        same = next(
            (r for r in rows if r["devices"] == flipped["devices"] and not r["variant"]), None
        )
        if same and same["throughput"]:
            sync_gain = (flipped["devices"], flipped["throughput"] / same["throughput"])
    options = [r for r in results["options"] if r["overrides"] and r.get("speedup")]
    best = max(options, key=lambda r: r["speedup"], default=None)
    return Findings(
        batch=compute["batch"],
        compute_rate=compute["batch"] / compute["lightning"]["mean_s"],
        pipeline_rate=loader[workers],
        workers=workers,
        best_workers=best_workers,
        best_pipeline_rate=loader[best_workers],
        framework_ratio=compute["framework_ratio"],
        steps_per_epoch=compute["steps_per_epoch"],
        most_devices=most,
        predicted=predicted,
        measured=measured,
        predicted_here=predicted_here,
        best_option=(best["option"], best["speedup"]) if best else None,
        sync_batchnorm_gain=sync_gain,
        here_terms=here_terms,
        gpu_terms=gpu_terms,
        pcie_terms=pcie_terms,
        spread=prediction.get("arrival_spread") if gpu_rows else None,
        flops_per_s=flops.get("achieved_flops_per_s"),
        peak_fraction=flops.get("utilisation"),
        device=compute["device"],
        flops_per_patch=flops.get("flops_per_patch"),
        gpu_basis=prediction.get("gpu_basis"),
        failed=tuple(
            (f["measurement"], f["error"], f["output"]) for f in failed_measurements(results)
        ),
        gloo_reason=gloo_reason,
        gloo_terms=gloo_terms,
    )


def _gloo_row(
    results: dict[str, Any], measured: list[dict[str, Any]]
) -> tuple[str | None, dict[str, Any] | None]:
    """Why the GPU ranks would use gloo, and its row on this machine's GPUs (at least 2).

    The row of the most predicted devices up to this machine's GPU count (2 on a machine
    with one), else of the fewest predicted; ``(None, None)`` without gloo rows.
    """
    gloo = results["prediction"].get("gloo") if _gpu_rows(results) else None
    if not gloo or not gloo["rows"]:
        return None, None
    here = max([2, *(row["devices"] for row in measured)])
    rows = sorted(gloo["rows"], key=lambda row: row["devices"])
    within = [row for row in rows if row["devices"] <= here]
    row = within[-1] if within else rows[0]
    return results["prediction"]["gpu_backend"]["reason"], row


def _gpu_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """bench.json's GPU predictions: none where bench measured no GPU.

    A bench.json from before holds GPU rows scaled from a CPU's step: they are no GPU's.
    """
    if results["config"]["accelerator"] != "cuda":
        return []
    return list(results["prediction"]["rows"])
