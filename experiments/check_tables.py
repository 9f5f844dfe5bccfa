"""Check that the experiments' README tables are what their scripts print from the result files.

    python experiments/check_tables.py          # from the repository root

For each experiment whose tables a committed script prints from a committed result
file, runs that script (or reads the file it wrote) and checks that every table row it
prints appears, as printed, in the experiment's README. Prints one line per experiment
and exits 1 when a row is missing. It measures nothing; the experiments' other figures
are audited by hand (each README says which file holds them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent

# experiment -> the command that prints its tables (run from the repository root), or
# the committed file a script wrote them into.
PRINTERS: dict[str, list[str] | Path] = {
    "scaling": [
        "experiments/scaling/pairs.py",
        "experiments/scaling/cpu-default",
        "experiments/scaling/cpu-512",
    ],
    "checkpoint-integrity": [
        "experiments/checkpoint-integrity/measure.py",
        "--table",
        "experiments/checkpoint-integrity/results.json",
    ],
    "decode-cache-digest": [
        "experiments/decode-cache-digest/measure.py",
        "--table",
        "experiments/decode-cache-digest/results.json",
    ],
    "preemption": [
        "experiments/preemption/measure.py",
        "--table",
        "experiments/preemption/results.json",
    ],
    "gpu": [
        "experiments/gpu/measure.py",
        "experiments/gpu/results/h200-2026-11-26.json",
        "--table",
    ],
    "large-data": [
        "experiments/large-data/measure.py",
        "--table",
        "experiments/large-data/results.json",
    ],
    "presets": [
        "experiments/presets/measure.py",
        "--table",
        "experiments/presets/results.json",
    ],
    "sync-batchnorm": [
        "experiments/sync-batchnorm/measure.py",
        "--table",
        "experiments/sync-batchnorm/cpu.json",
    ],
    "dataset-check": [
        "experiments/dataset-check/measure.py",
        "--table",
        "experiments/dataset-check/results.json",
    ],
    "windows-gloo": [
        "experiments/windows-gloo/measure.py",
        "--table",
        "experiments/windows-gloo/results.json",
    ],
    "step-overhead": [
        "experiments/step-overhead/measure.py",
        "--table",
        "experiments/step-overhead/results/quiet-lazy-decode-cache.json",
        "experiments/step-overhead/results/quiet-keep-freed-memory.json",
    ],
    "class-balance": EXPERIMENTS / "class-balance" / "results.md",
    "linear-scaling": EXPERIMENTS / "linear-scaling" / "results.md",
}


def printed(printer: list[str] | Path) -> str:
    """What the printer prints (or the file holds)."""
    if isinstance(printer, Path):
        return printer.read_text()
    return subprocess.run(
        [sys.executable, *printer],
        cwd=EXPERIMENTS.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def missing_rows(name: str, printer: list[str] | Path) -> list[str]:
    """The printed table rows that the experiment's README does not hold verbatim."""
    readme = (EXPERIMENTS / name / "README.md").read_text()
    rows = [line for line in printed(printer).splitlines() if line.startswith("|")]
    return [row for row in rows if row not in readme]


def main() -> int:
    """Check every experiment with a printer; 1 when a README lacks a printed row."""
    failed = False
    for name, printer in PRINTERS.items():
        missing = missing_rows(name, printer)
        print(f"{name}: " + ("ok" if not missing else f"{len(missing)} rows not in README.md"))
        for row in missing:
            print(f"    {row}")
        failed = failed or bool(missing)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
