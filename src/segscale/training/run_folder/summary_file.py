"""``summary.json``, the one file that says how a run ended: written atomically, read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from segscale.atomic_files import write_text_atomically

SUMMARY_FILE = "summary.json"
"""The summary's name in the run folder."""


def read_summary(run_folder: str | Path) -> dict[str, Any] | None:
    """The summary a run wrote into ``run_folder``; ``None`` if it did not finish."""
    path = Path(run_folder) / SUMMARY_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def write_summary(run_folder: str | Path, summary: dict[str, Any]) -> None:
    """Create or replace the summary of the run in ``run_folder``."""
    write_text_atomically(Path(run_folder) / SUMMARY_FILE, json.dumps(summary, indent=2))
