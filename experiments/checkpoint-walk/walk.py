"""The walk of ``segscale.load(ckpt)``: which modules a checkpoint's path passes through.

Writes a small DeepLabV3+ checkpoint (ResNet-18, random weights, as ``train.py`` stores
one), then traces ``segscale.load`` with ``sys.setprofile``: every call into a segscale
module that receives the checkpoint's path (the followed parameter) is a stop, and so
is every call into a segscale module made beneath such a call until it returns (the
code a reader follows from there). Printed: the stops in order (consecutive calls
within one module collapsed), the modules visited, the *returns* (a stop in a module
the walk had already left) and the *climbs* (a stop in a module of a higher layer than
the one before it, by pyproject.toml's layers).

    python experiments/checkpoint-walk/walk.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import segscale
from segscale.models.networks import build_network

try:  # this tree's checkpoint writer, wherever the tree keeps it
    from segscale.models.checkpoint.files import save_checkpoint_file
except ImportError:  # before the checkpoint package (up to cd09d51)
    from segscale.models.checkpoint_io import save_checkpoint_file  # type: ignore[no-redef]

LAYERS = (  # top to bottom, as the import contract lists them
    "segscale.api",
    "segscale.inference",
    "segscale.training",
    "segscale.models.checkpoint.trained",
    "segscale.models.module",
    "segscale.models.checkpoint",
    "segscale.models",
    "segscale.data",
    "segscale",
)


def layer(module: str) -> int:
    """The index of ``module``'s layer (0: the top)."""
    return next(i for i, prefix in enumerate(LAYERS) if module.startswith(prefix))


def write_checkpoint(path: Path) -> None:
    """A DeepLabV3+ R18 checkpoint of 2 classes with the record train.py writes."""
    model = {
        "_target_": "segscale.models.networks.build_network",
        "arch": "DeepLabV3Plus",
        "encoder": "resnet18",
        "encoder_weights": None,
        "num_classes": 2,
        "in_channels": 3,
    }
    network = build_network(**{k: v for k, v in model.items() if k != "_target_"})
    meta = {
        "checkpoint_format": 1,  # record.CHECKPOINT_FORMAT, written out: older trees lack it
        "segscale_version": segscale.__version__,
        "model": model,
        "class_names": ["background", "object"],
        "class_colors": None,
        "ignore_index": 255,
        "label_ids": None,
        "ignore_ids": [],
        "mean": [0.5, 0.5, 0.5],
        "std": [0.25, 0.25, 0.25],
        "max_value": 255.0,
        "data_source": {"_target_": "segscale.data.synthetic.SyntheticTiles"},
        "validation_inference": {"tile_size": 256, "overlap": 0.0, "blend": "none"},
        "value_range": None,
    }
    state = {f"network.{k}": v for k, v in network.state_dict().items()}
    save_checkpoint_file({"state_dict": state, "segscale": meta}, path)


def trace(path: Path, follow_path: bool) -> list[tuple[str, str]]:
    """The calls the walk makes, as (calling module, called module), in order.

    ``follow_path``: only calls that receive the checkpoint's path (as a ``str`` or
    ``Path`` argument); else every call into segscale beneath ``segscale.load``. The
    calling module is that of the innermost call counted before (``""`` for the first).
    """
    calls: list[tuple[str, str]] = []
    active: list[tuple[int, str]] = []  # the frames counted, innermost last, and modules

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "return":
            if active and active[-1][0] == id(frame):
                active.pop()
            return
        module = frame.f_globals.get("__name__", "")
        if event != "call" or not module.startswith("segscale"):
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        values = [frame.f_locals.get(name) for name in names]
        carries = any(str(v) == str(path) for v in values if isinstance(v, (str, Path)))
        if carries or (active and not follow_path):
            calls.append((active[-1][1] if active else "", module))
            active.append((id(frame), module))

    sys.setprofile(profile)
    try:
        segscale.load(path)
    finally:
        sys.setprofile(None)
    return calls


def report(calls: list[tuple[str, str]], title: str) -> None:
    """Print the walk: each call into another module is a stop.

    A *return* is a stop in a module the walk entered before; a *climb* a call into a
    module of a higher layer than its caller's (calls within one module are not stops).
    """
    stops = [(caller, module) for caller, module in calls if caller != module]
    seen: set[str] = set()
    lines, returns, climbs = [], 0, 0
    for caller, module in stops:
        marks = []
        if module in seen:
            returns += 1
            marks.append("return")
        if caller and layer(module) < layer(caller):
            climbs += 1
            marks.append("climb")
        seen.add(module)
        shown = f" ({', '.join(marks)})" if marks else ""
        lines.append(f"  {len(lines) + 1:2d}. {caller or '-'} -> {module}{shown}")
    modules = len(seen)
    print(f"{title}: {len(stops)} stops in {modules} modules, {returns} returns, {climbs} climbs")
    print("\n".join(lines))


def main() -> None:
    """Print the walk, following the path, then every call beneath ``segscale.load``."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "walk.ckpt"
        write_checkpoint(path)
        report(trace(path, follow_path=True), "the path followed")
        report(trace(path, follow_path=False), "every segscale call beneath segscale.load")


if __name__ == "__main__":
    main()
