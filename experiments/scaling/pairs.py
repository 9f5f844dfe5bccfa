"""Print the tables of experiments/scaling/README.md from the stored bench runs.

Usage: ``python experiments/scaling/pairs.py experiments/scaling/cpu-default …``

First the predicted-against-measured table (one row per measured ddp run with more than
one process), then, per run folder, the table of the figures the README quotes, each
read from that folder's ``bench.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from segscale.bench.report import comparison

# The interconnects whose 8-device prediction the README quotes.
QUOTED_LINKS = ("NVLink H100", "PCIe 5.0 x16")


def pairs_table(runs: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown rows: predicted against measured patches/s for every multi-process run."""
    lines = [
        "| run | devices | sync batch norm | predicted patches/s | measured | miss |",
        "|---|---|---|---|---|---|",
    ]
    for name, results in runs.items():
        for n, sync, predicted, measured in comparison(results):
            on = "on" if sync else "off"
            lines.append(
                f"| {name} | {n} | {on} | {predicted:.2f} | {measured:.2f} "
                f"| {predicted / measured - 1:+.1%} |"
            )
    return lines


def ms(seconds: float) -> str:
    """Seconds as whole milliseconds, thin-space-free (the README's style)."""
    return f"{1000 * seconds:.0f}"


def pipeline_row(pipeline: dict[str, Any]) -> str:
    """One core's crop, warp and augmented rates, then the DataLoader's per worker count."""
    loader = ", ".join(f"{w} workers {r:.0f}" for w, r in pipeline["loader"].items())
    return (
        f"crop alone {pipeline['crop_only']:.0f} patches/s, crop + warp "
        f"{pipeline['crop_and_warp']:.0f}, augmented {pipeline['augmented_one_core']:.0f}; "
        f"DataLoader {loader}"
    )


def step_row(compute: dict[str, Any]) -> str:
    """Lightning's and the bare loop's step, a train.py run's when measured, the FLOPs."""
    lightning, bare = compute["lightning"], compute["bare"]
    text = (
        f"Lightning {ms(lightning['mean_s'])} ms ± {ms(lightning['spread_s'])}, bare loop "
        f"{ms(bare['step']['mean_s'])} ms (forward {ms(bare['forward_s'])}, backward "
        f"{ms(bare['backward_s'])}, optimizer {ms(bare['optimizer_s'])})"
    )
    if compute.get("run_step_s"):
        text += (
            f", a 1-device `train.py` run {ms(compute['run_step_s'])} ms "
            f"(bench / run {compute['step_vs_run']:.3f})"
        )
    flops = compute["flops"]
    return (
        text + f"; {flops['flops_per_patch'] / 1e9:.2f} GFLOP per patch, "
        f"{flops['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s"
    )


def overhead_row(overhead: dict[str, Any]) -> str:
    """The framework's overhead per step and its rounds."""
    rounds = ", ".join(f"{r:.2f}" for r in overhead["rounds_ms"])
    return (
        f"{overhead['overhead_ms']:.2f} ms per step ± {overhead['spread_ms']:.2f} "
        f"({len(overhead['rounds_ms'])} rounds of {overhead['steps']} steps: {rounds})"
    )


def buckets_row(compute: dict[str, Any]) -> str:
    """DDP's gradient buckets and when in the backward pass each is ready."""
    sizes = ", ".join(f"{b / 2**20:.2f}" for b in compute["buckets"])
    ready = ", ".join(f"{r:.0%}" for r in compute["bucket_ready"])
    return f"{sizes} MiB, ready at {ready} of the backward pass"


def link_row(prediction: dict[str, Any]) -> str | None:
    """The all-reduce measured on this machine: latency and bus bandwidth."""
    link = next(
        (i for i in prediction["interconnects"] if i["name"] == prediction.get("this_machine")),
        None,
    )
    if link is None:
        return None
    return (
        f"{1000 * link['latency']:.2f} ms latency, {link['bus_bandwidth'] / 1e9:.2f} GB/s bus "
        f"bandwidth ({link['source']})"
    )


def sharing_row(sharing: dict[str, Any]) -> str:
    """Independent loops side by side: slowdown, ceiling, sync point, sync batch norm."""
    n = sharing["devices"]
    return (
        f"{ms(sharing['alone']['plain_s'])} → {ms(sharing['together']['plain_s'])} ms per "
        f"step ({sharing['slowdown']:.2f}× slower: {n} processes reach at most "
        f"{n / sharing['slowdown']:.2f}×); a sync point {1000 * sharing['sync_point_s']:.2f} ms "
        f"each; synchronized batch norm's arithmetic {ms(sharing['sync_batchnorm_compute_s'])} "
        "ms per step"
    )


def ddp_row(scaling: dict[str, Any]) -> str:
    """Measured ddp throughput per process count and variant, with the speed-up."""
    cells = []
    for row in scaling["measured"]:
        label = f"{row['devices']}" + (f" ({row['variant']})" if row.get("variant") else "")
        value = (
            f"error: {row['error']}"
            if row.get("error")
            else f"{row['throughput']:.3g} patches/s ({row['speedup']:.2f}×)"
        )
        cells.append(f"{label}: {value}")
    return "; ".join(cells)


def predicted_step(row: dict[str, Any]) -> str:
    """One predicted step and its terms."""
    return (
        f"{row['throughput']:.3g} patches/s, step {ms(row['step_s'])} ms: compute "
        f"{ms(row['compute_s'])}, batch norm {ms(row['sync_batchnorm_s'])}, gradient all-reduce "
        f"{ms(row['exposed_communication_s'])}, stragglers {ms(row['straggler_s'])}, loss "
        f"normaliser and buffers {ms(row['collectives_s'])}, overhead {ms(row['overhead_s'])}"
    )


def run_table(results: dict[str, Any]) -> list[str]:
    """Markdown rows: the figures of one bench run the README quotes."""
    compute, prediction = results["compute"], results["prediction"]
    pipeline = results["pipeline"]
    rows: list[tuple[str, str | None]] = [
        (f"data pipeline ({pipeline['patch_size']}²)", pipeline_row(pipeline)),
        ("step, one device", step_row(compute)),
        ("framework overhead", overhead_row(compute["overhead"])),
        ("DDP's buckets", buckets_row(compute)),
        ("this machine's all-reduce", link_row(prediction)),
    ]
    if results.get("sharing"):
        rows.append(("loops side by side, no DDP", sharing_row(results["sharing"])))
    rows.append(("ddp, processes", ddp_row(results["scaling"])))
    for row in prediction.get("this_machine_rows", []):
        sync = "on" if row["sync_batchnorm"] else "off"
        rows.append((f"predicted, {row['devices']} processes, sync {sync}", predicted_step(row)))
    most = max(row["devices"] for row in prediction["rows"])
    for row in prediction["rows"]:
        if row["devices"] == most and row["interconnect"] in QUOTED_LINKS:
            rows.append(
                (
                    f"predicted, {most} GPUs, {row['interconnect']}",
                    f"{row['speedup']:.2f}× ({row['efficiency']:.0%}): synchronized batch norm "
                    f"{ms(row['sync_batchnorm_s'])} ms, stragglers {ms(row['straggler_s'])} ms "
                    f"of a {ms(row['step_s'])} ms step",
                )
            )
    if results["options"]:
        options = "; ".join(
            f"`{o['option']}` error" if o.get("error") else f"`{o['option']}` {o['speedup']:.2f}×"
            for o in results["options"][1:]
        )
        rows.append(("options (bare step)", options))
    return ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows if v is not None)]


def main(folders: list[str]) -> None:
    """Print the pairs table, then one table per run folder."""
    runs = {
        Path(folder).name: json.loads((Path(folder) / "bench.json").read_text())
        for folder in folders
    }
    print("\n".join(pairs_table(runs)))
    for name, results in runs.items():
        print(f"\n{name}:\n")
        print("\n".join(run_table(results)))


if __name__ == "__main__":
    main(sys.argv[1:])
