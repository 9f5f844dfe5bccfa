"""What synchronized batch norm costs per training step, two ranks on one device.

    python experiments/sync-batchnorm/measure.py OUT.json [--label NAME] \
        [--encoder resnet50 --size 512 --batch 8] [--dtypes bf16 fp32] \
        [--variants plain global torch] [--steps 20 --warmup 10]
    python experiments/sync-batchnorm/measure.py --table OUT.json [OUT.json ...]

Two processes (gloo, as the GPU tier's two ranks sharing one GPU; CPU tensors on a
machine without CUDA) train DeepLabV3+ for ``--warmup`` + ``--steps`` steps, each rank on
its ``--batch`` patches, under DDP, with the network's batch norm left as it is
(``plain``: statistics of each rank's own batch), replaced by segscale's
``GlobalBatchNorm`` (``global``) or by PyTorch's ``nn.SyncBatchNorm`` (``torch``, which
needs CUDA). The steady step is the wall time of the timed steps over their count, the
device synchronized at both ends. ``segscale`` is imported from ``PYTHONPATH``: run it
once per source tree (``--label``) to compare two versions of the layer. Results are
merged into OUT.json under the label.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import segmentation_models_pytorch as smp
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import segscale
from segscale.runs.scaling.sync_batchnorm import convert_sync_batchnorm

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CONVERSIONS = {
    "plain": lambda model: model,
    "global": convert_sync_batchnorm,
    "torch": nn.SyncBatchNorm.convert_sync_batchnorm,
}


def _rank(rank: int, port: int, args: argparse.Namespace, result: str) -> None:
    """One rank: every dtype × variant, timed; rank 0 writes ``result``."""
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    generator = torch.Generator().manual_seed(rank)
    shape = (args.batch, 3, args.size, args.size)
    image = torch.randn(shape, generator=generator).to(device)
    image = image.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 6, (args.batch, args.size, args.size), generator=generator)
    labels = labels.to(device)
    rows: dict[str, dict] = {}
    for dtype in args.dtypes:
        for variant in args.variants:
            key = f"{variant} {dtype}"
            try:
                rows[key] = _timed(variant, DTYPES[dtype], image, labels, device, args)
            except Exception as error:  # a variant a device lacks (torch's on CPUs)
                rows[key] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
            if rank == 0:
                print(key, rows[key], flush=True)
    if rank == 0:
        Path(result).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _timed(
    variant: str,
    dtype: torch.dtype,
    image: torch.Tensor,
    labels: torch.Tensor,
    device: torch.device,
    args: argparse.Namespace,
) -> dict:
    """The steady step of one variant in one dtype (mixed precision below float32)."""
    torch.manual_seed(0)
    network = smp.DeepLabV3Plus(args.encoder, encoder_weights=None, classes=6)
    network = CONVERSIONS[variant](network).to(device).to(memory_format=torch.channels_last)
    model = DistributedDataParallel(network)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    mixed = dtype != torch.float32

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=mixed):
            loss = F.cross_entropy(model(image), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def synchronized() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        return time.perf_counter()

    for _ in range(args.warmup):
        step()
    start = synchronized()
    for _ in range(args.steps):
        step()
    seconds = (synchronized() - start) / args.steps
    return {"step_ms": 1000 * seconds}


def measure(args: argparse.Namespace) -> dict:
    """Run both ranks; the rows of rank 0 with the settings and the device."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "rows.json"
        mp.start_processes(_rank, args=(port, args, str(result)), nprocs=2, start_method="spawn")
        rows = json.loads(result.read_text())
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    settings = {key: getattr(args, key) for key in ("encoder", "size", "batch", "steps", "warmup")}
    return {
        "device": f"{device}, torch {torch.__version__}",
        "segscale": str(Path(segscale.__file__).parent),
        "settings": settings,
        "rows": rows,
    }


def print_table(files: list[Path]) -> None:
    """Each label's steps, and each variant against plain batch norm in the same dtype."""
    for file in files:
        for label, run in json.loads(file.read_text()).items():
            print(f"\n{label}: {run['device']}, {run['settings']}")
            print("| variant | dtype | step (ms) | / plain |")
            print("|---|---|---|---|")
            for key, row in run["rows"].items():
                variant, dtype = key.split(" ")
                if "error" in row:
                    print(f"| {variant} | {dtype} | {row['error'][:80]} | |")
                    continue
                plain = run["rows"].get(f"plain {dtype}", {}).get("step_ms")
                ratio = f"{row['step_ms'] / plain:.3f}" if plain else ""
                print(f"| {variant} | {dtype} | {row['step_ms']:.1f} | {ratio} |")


def main() -> None:
    """Measure into OUT.json under ``--label``, or print tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="+")
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--label", default="this")
    parser.add_argument("--encoder", default="resnet50")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8, help="patches per rank")
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=list(DTYPES))
    parser.add_argument(
        "--variants", nargs="+", default=list(CONVERSIONS), choices=list(CONVERSIONS)
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    if args.table:
        print_table(args.out)
        return
    out = args.out[0]
    results = json.loads(out.read_text()) if out.is_file() else {}
    results[args.label] = measure(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print_table([out])


if __name__ == "__main__":
    main()
