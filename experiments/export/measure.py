"""Exported file sizes and CPU latency of one 512×512 image: onnxruntime, TorchScript, PyTorch.

    python experiments/export/measure.py [--work DIR] [--threads 1 2] [--runs 20]

The default config's network (``conf/train.yaml``: DeepLabV3+, ResNet-18 encoder,
output stride 16, decoder_channels 128, 6 classes), randomly initialised (latency does
not depend on the weights), is saved as a checkpoint and exported with the real
command (``python export.py``, uint8 in, scores out, the built-in check on). Then one
1×3×512×512 uint8 image goes through each of PyTorch (the checkpoint's module forward,
eager, ``torch.inference_mode``), the TorchScript file and the ONNX file in
onnxruntime (CPU provider, default graph optimisations), with the same number of
intra-op threads, ``--warmup`` runs first, then ``--runs`` timed runs, alternating
between the three so that load from other processes hits them alike. Writes
``results.json`` beside this file and prints a table (medians, with min–max).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime
import torch
from omegaconf import OmegaConf

import segscale
from segscale.configs import compose_config
from segscale.data.sampling.patches import grid_inference
from segscale.inference.export.formats import load_exported
from segscale.models.checkpoint.files import save_checkpoint_file
from segscale.models.checkpoint.record import CHECKPOINT_FORMAT
from segscale.models.checkpoint.trained import TrainedModel, load_trained
from segscale.models.networks import build_network

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SIDE = 512


def default_checkpoint(path: Path) -> dict:
    """Save the default config's network (random weights) as a train.py-style checkpoint."""
    cfg = compose_config("train")
    model = OmegaConf.to_container(cfg.model, resolve=True)
    data = cfg.datamodule
    torch.manual_seed(0)
    network = build_network(**{k: v for k, v in model.items() if k != "_target_"}).eval()
    meta = {
        "model": model,
        "class_names": list(data.class_names),
        "class_colors": OmegaConf.to_container(data.class_colors),
        "ignore_index": int(data.ignore_index),
        "mean": list(data.mean),
        "std": list(data.std),
        "max_value": 255.0,
        "checkpoint_format": CHECKPOINT_FORMAT,
        "segscale_version": segscale.__version__,
        "label_ids": None,
        "ignore_ids": [],
        "data_source": {"_target_": "segscale.data.datasets.synthetic.SyntheticTiles"},
        "validation_inference": grid_inference(256),
        "value_range": None,
    }
    state = {f"network.{k}": v for k, v in network.state_dict().items()}
    save_checkpoint_file({"state_dict": state, "segscale": meta}, path)
    return model


def export(ckpt: Path, fmt: str, output: Path, work: Path) -> float:
    """Run ``python export.py`` for ``fmt``; return its wall time in seconds."""
    command = [
        sys.executable,
        str(REPO / "export.py"),
        f"ckpt={ckpt}",
        f"format={fmt}",
        f"output={output}",
        f"hydra.run.dir={work / f'run-{fmt}'}",
    ]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=work)
    return time.perf_counter() - start


def runners_for(
    trained: TrainedModel,
    scripted: Callable[[np.ndarray], np.ndarray],
    session: onnxruntime.InferenceSession,
    image: np.ndarray,
) -> dict[str, Callable[[], object]]:
    """One call of each runtime on ``image``: scores out."""
    tensor = torch.from_numpy(image)

    def pytorch() -> object:
        with torch.inference_mode():
            return trained.module(tensor)

    return {
        "pytorch": pytorch,
        "torchscript": lambda: scripted(image),
        "onnxruntime": lambda: session.run(None, {"image": image})[0],
    }


def latencies(runners: dict[str, Callable[[], object]], warmup: int, runs: int) -> dict:
    """Seconds per call of each runner: ``warmup`` untimed, then ``runs`` alternating."""
    for run in runners.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(runs):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {
        name: {
            "median_ms": 1e3 * statistics.median(t),
            "min_ms": 1e3 * min(t),
            "max_ms": 1e3 * max(t),
        }
        for name, t in times.items()
    }


def measure(work: Path, threads: list[int], warmup: int, runs: int) -> dict:
    """Sizes, export times and latencies; see the module docstring."""
    ckpt = work / "default.ckpt"
    model = default_checkpoint(ckpt)
    files = {"onnx": work / "default.onnx", "torchscript": work / "default.pt"}
    export_s = {fmt: export(ckpt, fmt, path, work) for fmt, path in files.items()}
    trained = load_trained(ckpt)
    image = np.random.default_rng(0).integers(0, 256, (1, 3, SIDE, SIDE), dtype=np.uint8)
    scripted = load_exported(files["torchscript"], "torchscript")
    results = []
    load_before = os.getloadavg()
    for count in threads:
        torch.set_num_threads(count)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = count, 1
        session = onnxruntime.InferenceSession(
            str(files["onnx"]), options, providers=["CPUExecutionProvider"]
        )

        runners = runners_for(trained, scripted, session, image)
        reference = np.asarray(runners["pytorch"]())
        agreement = float(np.abs(session.run(None, {"image": image})[0] - reference).max())
        results.append(
            {
                "threads": count,
                "max_abs_difference_onnx": agreement,
                **latencies(runners, warmup, runs),
            }
        )
    return {
        "network": {k: v for k, v in model.items() if k != "_target_"},
        "parameters": sum(p.numel() for p in trained.module.network.parameters()),
        "checkpoint_mb": ckpt.stat().st_size / 1e6,
        "file_mb": {fmt: path.stat().st_size / 1e6 for fmt, path in files.items()},
        "export_s": export_s,
        "image": f"1x3x{SIDE}x{SIDE} uint8",
        "warmup": warmup,
        "runs": runs,
        "cpu_count": os.cpu_count(),
        # 1-minute load averages before and after the timings: other processes share the CPU.
        "load_average": [load_before[0], os.getloadavg()[0]],
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
        "latency": results,
    }


def main() -> None:
    """Measure, write ``results.json`` beside this file and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", type=Path, default=None, help="scratch folder (default: a temporary one)"
    )
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        results = measure(work, args.threads, args.warmup, args.runs)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"sizes (MB): checkpoint {results['checkpoint_mb']:.1f}, "
        + ", ".join(f"{k} {v:.1f}" for k, v in results["file_mb"].items())
    )
    print("load average: {:.1f} → {:.1f}".format(*results["load_average"]))
    print("export (s): " + ", ".join(f"{k} {v:.1f}" for k, v in results["export_s"].items()))
    print("| threads | PyTorch | TorchScript | onnxruntime |\n|---|---|---|---|")
    for row in results["latency"]:
        cells = [
            f"{row[k]['median_ms']:.0f} ms ({row[k]['min_ms']:.0f}–{row[k]['max_ms']:.0f})"
            for k in ("pytorch", "torchscript", "onnxruntime")
        ]
        print(f"| {row['threads']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
