"""What ``bench.py`` leaves behind: the terminal table, ``bench.json`` and the plots."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from segscale.atomic_files import write_text_atomically
from segscale.figure_files import plt, save_figure

FILE = "bench.json"

DATA_BOUND = "*"
"""The mark on a predicted cell that the data pipeline limits; its footnote follows the table."""
DATA_BOUND_NOTE = "limited by the data pipeline"


def write_json(results: dict[str, Any], folder: Path) -> Path:
    """Write ``bench.json`` into ``folder`` atomically; its path."""
    return write_text_atomically(folder / FILE, json.dumps(results, indent=2))


def _rows(title: str, rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(name) for name, _ in rows)
    return [title, *(f"  {name:<{width}}  {value}" for name, value in rows)]


NETWORK_TERMS = ("training_step", "backward", "optimizer")
"""The terms of a profiled step that hold the tiny network's own work (the bare loop's too)."""


def overhead_term_rows(overhead: dict[str, Any]) -> list[tuple[str, str]]:
    """Where the framework's step goes, by term, in ms per step (``Overhead.terms_ms``).

    The terms that are not the network's work come first, each with its share of the
    profiled step; the network's (``training_step``, ``backward``, ``optimizer``, on the
    near-zero network) in one row after them.
    """
    terms = overhead.get("terms_ms") or {}
    if not terms:
        return []
    whole = sum(terms.values())
    framework = [(name, ms) for name, ms in terms.items() if name not in NETWORK_TERMS]
    framework.sort(key=lambda item: -item[1])
    shown = [(name, ms) for name, ms in framework if ms >= 0.005]
    rows = [
        (f"  {name}", f"{ms:.2f} ms ({100 * ms / whole:.0f}% of the profiled step)")
        for name, ms in shown
    ]
    left = len(framework) - len(shown)
    network = " + ".join(f"{name} {terms.get(name, 0.0):.2f}" for name in NETWORK_TERMS)
    rows.append(("  the tiny network's own", f"{network} ms (with the module's logging)"))
    if left:
        rows.append(("  (below 0.005 ms)", f"{left} more term(s)"))
    return [("framework overhead, by term", "Lightning's SimpleProfiler, one more round"), *rows]


def table(results: dict[str, Any]) -> str:
    """The results as the plain-text table printed on the terminal."""
    lines: list[str] = []
    pipeline, compute = results["pipeline"], results["compute"]
    lines += _rows(
        f"Data pipeline ({pipeline['patch_size']}² patches, patches/s)",
        [
            ("crop alone, one core", f"{pipeline['crop_only']:.0f}"),
            ("crop + one warp, one core", f"{pipeline['crop_and_warp']:.0f}"),
            (
                "augmented, one core",
                f"{pipeline['augmented_one_core']:.0f} "
                f"({pipeline['augmentation_cost']:.2f}× the cost of crop + warp)",
            ),
            *loader_rows(pipeline),
            *storage_rows(pipeline.get("storage")),
        ],
    )
    lightning, bare = compute["lightning"], compute["bare"]
    step = lightning["mean_s"]
    lines += _rows(
        compute_title(compute),
        [
            (
                "step, Lightning",
                f"{1000 * step:.1f} ms ± {1000 * lightning['spread_s']:.1f} "
                f"over {len(lightning['window_means_s'])} windows, "
                f"{compute['batch'] / step:.1f} patches/s",
            ),
            (
                "step, bare PyTorch loop",
                f"{1000 * bare['step']['mean_s']:.1f} ms (forward {1000 * bare['forward_s']:.1f}, "
                f"backward {1000 * bare['backward_s']:.1f}, "
                f"optimizer {1000 * bare['optimizer_s']:.1f})",
            ),
            ("Lightning / bare", f"{compute['framework_ratio']:.3f}"),
            ("step of a train.py run (1 device)", run_step_text(compute, results["scaling"])),
            ("peak memory", f"{compute['peak_memory_mb']:.0f} MB ({compute['memory_kind']})"),
            ("parameters", f"{compute['parameters'] / 1e6:.2f} M"),
            (
                "gradient per step",
                f"{compute['gradient_bytes'] / 2**20:.1f} MiB in {len(compute['buckets'])} "
                f"DDP buckets",
            ),
            ("batch-norm layers", f"{compute['batchnorm_layers']}"),
            (
                "framework overhead",
                f"{compute['overhead']['overhead_ms']:.2f} ms per step "
                f"± {compute['overhead']['spread_ms']:.2f} (Lightning with train.py's "
                f"callbacks against the bare loop, near-zero-compute network)",
            ),
            *overhead_term_rows(compute["overhead"]),
            ("FLOPs", flops_text(compute["flops"])),
        ],
    )
    if results["options"]:
        lines += _rows(
            "Options (bare step, one at a time)",
            [
                (
                    row["option"],
                    f"error: {row['error']}"
                    if row["error"]
                    else f"{1000 * row['step_s']:.1f} ms, {row['speedup']:.2f}×, "
                    f"{row['peak_memory_mb']:.0f} MB, warm-up {row['warmup_s']:.1f} s",
                )
                for row in results["options"]
            ],
        )
    lines += _rows(
        f"Scaling, measured (strategy=ddp, {results['scaling']['per_device']})",
        [
            (
                f"{row['devices']} devices" + (f", {row['variant']}" if row["variant"] else ""),
                f"error: {row['error']}"
                if row["error"]
                else f"{row['throughput']:.1f} patches/s, speed-up {row['speedup']:.2f}, "
                f"efficiency {row['efficiency']:.0%}",
            )
            for row in results["scaling"]["measured"]
        ],
    )
    shared = results.get("sharing")
    if shared:
        together = shared["together"]
        lines += _rows(
            f"{shared['devices']} processes side by side (no DDP), against one alone",
            [
                (
                    "bare step",
                    f"{1000 * shared['alone']['plain_s']:.0f} ms alone, "
                    f"{1000 * together['plain_s']:.0f} ms side by side: "
                    f"{shared['slowdown']:.2f}× slower",
                ),
                (
                    "one sync point",
                    f"{1000 * shared['sync_point_s']:.2f} ms "
                    f"({together['sync_points']} per forward pass, one per batch-norm layer)",
                ),
                (
                    "sync batch norm's arithmetic",
                    f"{1000 * shared['sync_batchnorm_compute_s']:.0f} ms per step",
                ),
            ],
        )
    pairs = comparison(results)
    if pairs:
        lines += _rows(
            "This machine: predicted against measured (patches/s)",
            [
                (
                    f"{n} devices, sync batch norm {'on' if sync else 'off'}",
                    f"predicted {p:.1f}, measured {m:.1f} ({p / m - 1:+.0%})",
                )
                for n, sync, p, m in pairs
            ],
        )
    lines += predicted_rows(results["prediction"]["rows"])
    lines += gloo_rows(results["prediction"])
    lines += alternatives(results)
    lines += ["", "Verdict", results["verdict"]]
    return "\n".join(lines)


def predicted_rows(predicted: list[dict[str, Any]]) -> list[str]:
    """The GPU predictions per interconnect and devices; none where bench measured no GPU."""
    if not predicted:
        return ["Scaling, predicted on GPUs: none (bench measured no GPU; the verdict says why)"]
    devices = sorted({row["devices"] for row in predicted})
    links = list(dict.fromkeys(row["interconnect"] for row in predicted))
    cells = {(r["interconnect"], r["devices"]): r for r in predicted}
    lines = _rows(
        "Scaling, predicted: speed-up (efficiency) on " + ", ".join(map(str, devices)) + " devices",
        [(link, "   ".join(cell(cells.get((link, n))) for n in devices)) for link in links],
    )
    marked = [
        f"{link} on {n} devices"
        for link in links
        for n in devices
        if (row := cells.get((link, n))) and row["data_bound"]
    ]
    return [*lines, *footnote(marked)]


def gloo_rows(prediction: dict[str, Any]) -> list[str]:
    """GPU ranks under gloo: its link's parts, and the speed-up on each number of devices."""
    gloo = prediction.get("gloo")
    if not gloo:
        return []
    link = gloo["link"]
    reason = prediction["gpu_backend"]["reason"]
    rows = sorted(gloo["rows"], key=lambda row: row["devices"])
    marked = [f"{row['devices']} devices" for row in rows if row["data_bound"]]
    lines = _rows(
        f"Scaling, predicted under gloo ({reason}): {link['name']}, "
        f"copies {link['device_to_host'] / 1e9:.1f} GB/s to the host and "
        f"{link['host_to_device'] / 1e9:.1f} back, host all-reduce "
        f"{1000 * link['host_latency']:.2f} ms latency, "
        f"{link['host_bus_bandwidth'] / 1e9:.2f} GB/s bus bandwidth",
        [
            (
                f"{row['devices']} devices",
                f"{cell(row)}: step {1000 * row['step_s']:.0f} ms, of which gradients "
                f"{1000 * row['exposed_communication_s']:.0f} ms past backward, synchronized "
                f"batch norm {1000 * row['sync_batchnorm_s']:.0f} ms",
            )
            for row in rows
        ],
    )
    return [*lines, *footnote(marked)]


def alternatives(results: dict[str, Any]) -> list[str]:
    """The most devices per interconnect with sync batch norm off and under the other spread."""
    prediction = results["prediction"]
    spread = prediction.get("arrival_spread")
    if not spread or not prediction["rows"]:
        return []
    most = max(row["devices"] for row in prediction["rows"])
    rows = [row for row in prediction["rows"] if row["devices"] == most]
    used, other = spread["used"], spread["alternative"]
    title = (
        f"Scaling, predicted on {most} devices: as above (arrival spread {used['name']}, "
        f"{1000 * used['collective_s']:.3f} ms); {other['name']} spread "
        f"({1000 * other['collective_s']:.3f} ms)"
    )
    title += "; sync batch norm off" if any("without_sync_batchnorm" in r for r in rows) else ""
    keys = {
        "other_spread": f"{other['name']} spread",
        "without_sync_batchnorm": "sync batch norm off",
    }
    lines = _rows(
        title,
        [
            (row["interconnect"], "   ".join(cell(row[key]) for key in keys if key in row))
            for row in rows
        ],
    )
    marked = [
        f"{row['interconnect']}, {name}"
        for row in rows
        for key, name in keys.items()
        if key in row and row[key]["data_bound"]
    ]
    return [*lines, *footnote(marked)]


def footnote(marked: list[str]) -> list[str]:
    """The footnote that follows a table with ``DATA_BOUND`` on the cells ``marked`` names.

    It names each marked cell (its row, and its column where the row has several), so
    that the mark points at them; none for a table without a mark.
    """
    if not marked:
        return []
    return [f"  {DATA_BOUND} {DATA_BOUND_NOTE}: {'; '.join(marked)}"]


def compute_title(compute: dict[str, Any]) -> str:
    """The compute table's title: the one device, with its threads and DataLoader workers.

    They are a ``python train.py`` run's on one device (``training.threads``, the
    datamodule's workers); a ``bench.json`` from before names the threads alone, if any.
    """
    device = [f"one {compute['device']}"]
    if compute.get("threads"):
        device.append(_count(compute["threads"], "thread"))
    if compute.get("loader_workers") is not None:
        device.append(_count(compute["loader_workers"], "loader worker"))
    return f"Compute ({', '.join(device)}, batch {compute['batch']}, {compute['precision']})"


def loader_rows(pipeline: dict[str, Any]) -> list[tuple[str, str]]:
    """The DataLoader's patches/s at each worker count; a one-device run's count said."""
    ones = pipeline.get("rank_workers", {}).get("1")
    return [
        (
            f"DataLoader, {w} workers" + (" (a one-device run's)" if str(w) == str(ones) else ""),
            f"{r:.0f}",
        )
        for w, r in pipeline["loader"].items()
    ]


def run_step_text(compute: dict[str, Any], scaling: dict[str, Any]) -> str:
    """The 1-device ``train.py`` run's step, and bench's step over it where comparable."""
    if not compute.get("run_step_s"):
        return "not measured"
    text = f"{1000 * compute['run_step_s']:.1f} ms"
    if compute.get("step_vs_run") is not None:
        return f"{text}; bench's step / the run's: {compute['step_vs_run']:.3f}"
    return (
        f"{text} with {_count(scaling['threads'], 'thread')} (bench.threads_per_process, as "
        f"every ddp run), not compared with the step above "
        f"({_count(compute['threads'], 'thread')})"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def storage_rows(storage: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The DataLoader with the tiles as stored and decoded into memory, and their ratio."""
    if storage is None:  # a bench.json from before
        return []
    workers = storage["workers"]
    kinds = ", ".join(f"{kind}: {n}" for kind, n in storage["stored_as"].items())
    stored = f"DataLoader, {workers} workers, tiles as stored ({kinds})"
    if storage["skipped"]:
        return [(stored, f"not compared: {storage['skipped']}")]

    def rounds(rates: list[float]) -> str:
        return f"{statistics.median(rates):.0f} (rounds: {', '.join(f'{r:.0f}' for r in rates)})"

    return [
        (stored, rounds(storage["stored"])),
        (
            f"same, decoded in memory ({storage['in_memory_tiles']} of {storage['tiles']} "
            f"tiles, {storage['decoded_mb']:.0f} MB)",
            rounds(storage["in_memory"]),
        ),
        ("as stored / in memory", f"{storage['ratio']:.2f}×"),
    ]


def flops_text(flops: dict[str, Any]) -> str:
    """FLOPs per patch, achieved FLOP/s and the share of the device's peak when known."""
    text = (
        f"{flops['flops_per_patch'] / 1e9:.2f} GFLOP per patch (forward + backward), "
        f"{flops['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s achieved"
    )
    if flops.get("utilisation") is not None:
        text += f", {flops['utilisation']:.0%} of peak"
    return text


def comparison(results: dict[str, Any]) -> list[tuple[int, bool, float, float]]:
    """(devices, sync batch norm, predicted, measured patches/s) for each measured ddp run."""
    configured = results["scaling"]["sync_batchnorm"]
    predicted = {
        (row["devices"], row["sync_batchnorm"]): row["throughput"]
        for row in results["prediction"].get("this_machine_rows", [])
    }
    pairs = []
    for row in results["scaling"]["measured"]:
        sync = configured != bool(row["variant"])
        key = (row["devices"], sync)
        if row["devices"] > 1 and row["throughput"] and key in predicted:
            pairs.append((row["devices"], sync, predicted[key], row["throughput"]))
    return pairs


def cell(row: dict[str, Any] | None) -> str:
    """One predicted speed-up and efficiency; ``*`` when the data pipeline limits it."""
    if row is None:
        return "-"
    mark = DATA_BOUND if row["data_bound"] else ""
    return f"{row['speedup']:.2f}× ({row['efficiency']:.0%}){mark}"


def plot_scaling(results: dict[str, Any], path: Path) -> bool:
    """Throughput and efficiency against devices: measured points, predicted lines.

    Written only with a measured point (a ddp run that ran): False, and no file, without
    one. Runs that failed are named on it.
    """
    scaling = results["scaling"]
    measured = [r for r in scaling["measured"] if not r["error"] and not r["variant"]]
    if not measured:
        return False
    figure, (rate_axis, efficiency_axis) = plt.subplots(1, 2, figsize=(12, 4.5))
    by_link: dict[str, list[dict[str, Any]]] = {}
    gloo = results["prediction"].get("gloo") or {"rows": []}
    for row in [*results["prediction"]["rows"], *gloo["rows"]]:
        by_link.setdefault(row["interconnect"], []).append(row)
    for link, rows in by_link.items():
        rows = sorted(rows, key=lambda r: r["devices"])
        devices = [1] + [r["devices"] for r in rows]
        one = results["prediction"]["one_device_throughput"]
        rate_axis.plot(devices, [one] + [r["throughput"] for r in rows], "--", label=link)
        efficiency_axis.plot(devices, [1.0] + [r["efficiency"] for r in rows], "--", label=link)
    here = [
        r
        for r in results["prediction"].get("this_machine_rows", [])
        if r["sync_batchnorm"] == scaling["sync_batchnorm"]
    ]
    for axis, key, rows in (
        (rate_axis, "throughput", measured),
        (efficiency_axis, "efficiency", [r for r in measured if r["efficiency"] is not None]),
    ):
        style = {"color": "black", "marker": "o", "linestyle": "-", "label": "measured here"}
        axis.plot([r["devices"] for r in rows], [r[key] for r in rows], **style)
        marks = {"color": "tab:red", "marker": "x", "linestyle": "", "label": "predicted here"}
        axis.plot([r["devices"] for r in here], [r[key] for r in here], **marks)
    failed = [r for r in scaling["measured"] if r["error"]]
    if failed:
        names = ", ".join(
            f"{r['devices']}" + (f" ({r['variant']})" if r["variant"] else "") for r in failed
        )
        figure.suptitle(f"ddp runs that failed (bench.json has why): {names} devices", fontsize=9)
    rate_axis.set_ylabel("patches/s (all devices)")
    efficiency_axis.set_ylabel("efficiency (speed-up / devices)")
    efficiency_axis.set_ylim(0, 1.05)
    for axis in (rate_axis, efficiency_axis):
        axis.set_xlabel("devices")
        axis.grid(alpha=0.3)
    efficiency_axis.legend(fontsize=8)
    save_figure(figure, path)
    return True


def plot_pipeline(results: dict[str, Any], path: Path) -> None:
    """DataLoader patches/s against workers, beside one core's ceilings and the device's need."""
    pipeline = results["pipeline"]
    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    workers = [int(w) for w in pipeline["loader"]]
    axis.plot(workers, list(pipeline["loader"].values()), "o-", color="black", label="DataLoader")
    for key, text, colour in (
        ("crop_only", "crop alone × workers", "tab:green"),
        ("crop_and_warp", "crop + warp × workers", "tab:blue"),
    ):
        axis.plot(workers, [pipeline[key] * w for w in workers], ":", color=colour, label=text)
    need = results["compute"]["batch"] / results["compute"]["lightning"]["mean_s"]
    axis.axhline(need, color="tab:red", label="one device consumes")
    axis.set_yscale("log")
    axis.set_xlabel("DataLoader workers")
    axis.set_ylabel("patches/s")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    save_figure(figure, path)
