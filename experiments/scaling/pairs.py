"""Print the predicted-against-measured table of stored bench runs (experiments/scaling).

Usage: ``python experiments/scaling/pairs.py experiments/scaling/cpu-default …``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from segscale.bench.report import comparison


def main(folders: list[str]) -> None:
    """One markdown row per measured ddp run with more than one process."""
    print("| run | devices | sync batch norm | predicted patches/s | measured | miss |")
    print("|---|---|---|---|---|---|")
    for folder in folders:
        results = json.loads((Path(folder) / "bench.json").read_text())
        for n, sync, predicted, measured in comparison(results):
            miss = predicted / measured - 1
            on = "on" if sync else "off"
            print(
                f"| {Path(folder).name} | {n} | {on} | {predicted:.2f} | {measured:.2f} "
                f"| {miss:+.1%} |"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
