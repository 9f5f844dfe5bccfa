"""Figures the docs state that come from a committed result file: the page and the file agree.

A timing is not a test (experiments/default-run/check.py measures it again); that the
page states what the result file holds is.
"""

from __future__ import annotations

import json
import re

from tests.conftest import REPO


def test_the_default_runs_documented_time_is_the_measured_median():
    results = json.loads((REPO / "experiments/default-run/results.json").read_text())
    walls = [run["wall_s"] for run in results["runs"]]
    assert results["wall_s_median"] == sorted(walls)[len(walls) // 2]
    assert results["wall_s_spread"] == round(max(walls) - min(walls), 1)
    page = (REPO / "docs/getting-started.md").read_text()
    stated = re.search(r"the whole run takes about (\d+) min (\d+) s", page)
    assert stated, "docs/getting-started.md no longer states the default run's time"
    minutes, seconds = divmod(round(results["wall_s_median"]), 60)
    assert (int(stated.group(1)), int(stated.group(2))) == (minutes, seconds)
    assert f"**{minutes} min {seconds:02d} s**" in page  # the Measured table
