"""A fresh run takes only a folder without another run's results.

Continuing a run is what ``ckpt_path`` is for; a fresh run started into a folder that
holds one would mix its checkpoints, metrics and summary with the earlier run's.
"""

from __future__ import annotations

from pathlib import Path

from segscale.errors import ConfigError

RESULTS = ("summary.json", "metrics.csv")
"""Files that only a run that trained writes (besides its checkpoints)."""


def check_fresh_folder(folder: str | Path) -> None:
    """Refuse to start a new run in a folder that holds another run's results."""
    folder = Path(folder)
    found = [name for name in RESULTS if (folder / name).exists()]
    found += ["checkpoints/"] if list((folder / "checkpoints").glob("*.ckpt")) else []
    if found:
        raise ConfigError(
            f"{folder} already holds a run ({', '.join(found)}); continue it with "
            f"ckpt_path=auto (or a checkpoint of it), or start this run in another folder "
            "(hydra.run.dir)"
        )
