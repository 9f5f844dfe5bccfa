"""Does the documented time of the default run still hold? Measure it again and compare.

    python experiments/default-run/check.py [--repeats 1]

Reads the wall time that docs/getting-started.md states for ``python train.py`` (the
sentence "the whole run takes about M min SS s"), runs the default command ``--repeats``
times as ``measure.py`` does, and exits 1 when the median of the new runs and the
documented time differ by more than the timing's own run-to-run spread, recorded in
``results.json`` beside this script (max − min of its runs), or 0 when they agree. Run it
on an otherwise idle machine of the kind the page names (2 CPU cores); it takes about
as long as the runs. Not part of the test suite: a timing is not a test.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAGE = HERE.parents[1] / "docs" / "getting-started.md"
SENTENCE = re.compile(r"the whole run takes about (\d+) min (\d+) s")

sys.path.insert(0, str(HERE))
from measure import one_run  # noqa: E402  (the script beside this one)


def documented_seconds(page: Path = PAGE) -> float:
    """The default run's wall time as the page states it."""
    found = SENTENCE.search(page.read_text())
    if found is None:
        raise SystemExit(f"{page}: no sentence 'the whole run takes about M min SS s'")
    return 60 * int(found.group(1)) + int(found.group(2))


def main() -> int:
    """Measure, compare, print the verdict; the exit status says whether it holds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    documented = documented_seconds()
    spread = float(json.loads((HERE / "results.json").read_text())["wall_s_spread"])
    with tempfile.TemporaryDirectory(prefix="segscale-check-") as scratch:
        walls = [one_run([], Path(scratch) / str(i))["wall_s"] for i in range(args.repeats)]
    fresh = statistics.median(walls)
    drift = fresh - documented
    print(
        f"documented {documented:.0f} s, measured {fresh:.1f} s ({walls}), drift {drift:+.1f} s, "
        f"allowed ±{spread:.1f} s (the recorded runs' spread)"
    )
    if abs(drift) > spread:
        print("the documented time no longer holds: re-measure with measure.py and update the page")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
