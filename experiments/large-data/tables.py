"""The README's tables, printed from ``results.json`` (``measure.py --table``)."""

from __future__ import annotations

import statistics
from typing import Any

SETUP = "trainer, ranks, data setup"
"""The start-up phase in which each rank opens (before: decodes) the tiles."""


def row(*cells: Any) -> str:
    """One Markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header(*names: str) -> str:
    """A Markdown table's header and rule."""
    return row(*names) + "\n|" + "---|" * len(names)


def runs_of(rows: list[dict], code: str, tiles: int) -> list[dict]:
    """The runs of ``code`` (before, after) on ``tiles`` tiles."""
    return [r for r in rows if r["code"] == code and r["tiles"] == tiles]


def gb_pair(runs: list[dict], pss: str, private: str) -> str:
    """PSS / private (GB) of each run, ``; ``-separated."""
    return "; ".join(f"{r[pss]:.2f} / {r[private]:.2f}" for r in runs)


def all_rows(part: dict) -> list[dict]:
    """A step's rows: those of its last run and those it kept of the other tree."""
    return part["rows"] + part.get("kept", [])


def memory_table(part: dict, rerun: list[dict] | None = None) -> list[str]:
    """Peak memory at 2 and 8 tiles, before and after.

    ``rerun``: runs of the same command with the tree as finally merged (the startup
    step's runs of this tree), a row of their own.
    """
    lines = [
        header(
            "tiles",
            "decoded (GB)",
            "code",
            "peak PSS / private, whole run (GB)",
            "until training ends (GB)",
            "exit",
        )
    ]
    rows = all_rows(part)
    for tiles in sorted({r["tiles"] for r in rows}):
        for code in ("before", "after"):
            runs = runs_of(rows, code, tiles)
            lines.append(
                row(
                    tiles,
                    f"{tiles * 4096 * 4096 * 4 / 1e9:.2f}",
                    code,
                    gb_pair(runs, "peak_pss_gb", "peak_private_gb"),
                    gb_pair(runs, "training_peak_pss_gb", "training_peak_private_gb"),
                    ", ".join(str(r["exit"]) for r in runs),
                )
            )
        again = runs_of(rerun or [], "after", tiles)
        if again:
            lines.append(
                row(
                    tiles,
                    f"{tiles * 4096 * 4096 * 4 / 1e9:.2f}",
                    "after, as merged (the startup runs)",
                    gb_pair(again, "peak_pss_gb", "peak_private_gb"),
                    gb_pair(again, "training_peak_pss_gb", "training_peak_private_gb"),
                    ", ".join(str(r["exit"]) for r in again),
                )
            )
    return lines


def load(run: dict) -> str:
    """The 1-minute load average before a run (``-``: not recorded)."""
    return f"{run['load_before'][0]:.1f}" if run.get("load_before") else "-"


def startup_table(part: dict) -> list[str]:
    """Time to the first step per tile count, against the smallest; the data setup phase."""
    lines = [
        header(
            "tiles",
            "code",
            "time to first step (s), runs",
            "median",
            "× at 2 tiles",
            "of it: trainer, ranks, data setup (s)",
            "load before",
        )
    ]
    rows = all_rows(part)
    for code in ("before", "after"):
        base = statistics.median(r["time_to_first_step_s"] for r in runs_of(rows, code, 2))
        for tiles in sorted({r["tiles"] for r in rows}):
            runs = runs_of(rows, code, tiles)
            times = [r["time_to_first_step_s"] for r in runs]
            median = statistics.median(times)
            lines.append(
                row(
                    tiles,
                    code,
                    ", ".join(f"{t:.1f}" for t in times),
                    f"{median:.1f}",
                    f"{median / base:.2f}",
                    ", ".join(f"{r['startup_phases_s'][SETUP]:.1f}" for r in runs),
                    ", ".join(load(r) for r in runs),
                )
            )
    return lines


def rates_table(part: dict) -> list[str]:
    """Patches/s as stored and in memory: every round, and the ratio's median and spread.

    Each repeat is one ``measure_storage``: 3 alternating rounds of each, its ratio that
    of the medians. The summary pools the rounds of every repeat.
    """
    lines = [
        header(
            "tiles as stored",
            "bands interleaved by",
            "repeat",
            "as stored, rounds (patches/s)",
            "in memory, rounds (patches/s)",
            "ratio of medians",
            "load before",
        )
    ]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in part["rows"]:
        kinds = ", ".join(f"{k}: {n}" for k, n in r["stored_as"].items())
        path = "np.moveaxis (before the fix)" if r.get("variant") else "cv2.merge"
        path = path if r["kind"] == "tif" else "-"
        groups.setdefault((kinds, path), []).append(r)
        lines.append(
            row(
                kinds,
                path,
                r["repeat"] + 1,
                ", ".join(f"{x:.0f}" for x in r["stored"]),
                ", ".join(f"{x:.0f}" for x in r["in_memory"]),
                f"{r['ratio']:.2f}",
                f"{r['load_before'][0]:.2f}",
            )
        )
    lines += [
        "",
        header(
            "tiles as stored",
            "bands interleaved by",
            "workers",
            "as stored, median of all rounds",
            "in memory, median of all rounds",
            "ratio of those medians",
            "ratio per repeat: median (min–max)",
        ),
    ]
    for (kinds, path), runs in groups.items():
        stored = statistics.median(x for r in runs for x in r["stored"])
        in_memory = statistics.median(x for r in runs for x in r["in_memory"])
        ratios = [r["ratio"] for r in runs]
        lines.append(
            row(
                kinds,
                path,
                runs[0]["workers"],
                f"{stored:.0f}",
                f"{in_memory:.0f}",
                f"{stored / in_memory:.2f}",
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})",
            )
        )
    return lines


def large_table(part: dict) -> list[str]:
    """The run on a dataset larger than memory."""
    ram = part["ram_bytes"]
    lines = [
        f"{part['tiles']} tiles: the images {part['decoded_image_bytes'] / 1e9:.1f} GB decoded "
        f"= {part['decoded_image_bytes'] / ram:.2f}× this machine's {ram / 1e9:.1f} GB, "
        f"with the masks {part['decoded_bytes'] / 1e9:.1f} GB "
        f"= {part['decoded_bytes'] / ram:.2f}×; "
        f"{part['disk_bytes'] / 1e9:.2f} GB on disk",
        "",
        header(
            "run",
            "exit",
            "wall (s)",
            "peak PSS (GB)",
            "peak private (GB)",
            "time to first step (s)",
            "steady patches/s",
            "patches trained",
        ),
    ]
    names = [
        "after, first run (dataset check; beside the before run)",
        "after, the check cached (alone of these runs)",
        "before (every rank decodes every tile)",
    ]
    for name, r in zip(names, part["runs"], strict=True):
        killed = r.get("killed_at")
        exit_text = (
            f"killed at {killed['pss'] / 1e9:.1f} GB, {killed['s']:.0f} s" if killed else r["exit"]
        )
        lines.append(
            row(
                name,
                exit_text,
                r["wall_s"],
                f"{r['peak_pss_gb']:.2f}",
                f"{r['peak_private_gb']:.2f}",
                r["time_to_first_step_s"] or "-",
                r["steady_patches_per_s"] or "-",
                r["train_patches"] or "-",
            )
        )
    return lines


def print_tables(results: dict) -> None:
    """Every table of the steps ``results`` holds."""
    rerun = results.get("startup", {}).get("rows", [])
    for step, make in (
        ("memory", lambda part: memory_table(part, rerun)),
        ("startup", startup_table),
        ("rates", rates_table),
        ("rates_earlier", rates_table),
        ("large", large_table),
    ):
        if step in results:
            print(f"## {step}\n")
            print("\n".join(make(results[step])))
            print()
