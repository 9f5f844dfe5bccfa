"""The training loop a user would write by hand: PyTorch + smp + albumentations, no segscale.

    python experiments/gpu/handwritten_loop.py OUT.json [--data data/synthetic/<set>] \
        [--precision bf16] [--steps 70 --warmup 20] [--workers 8] [--batch 16]

The yardstick of issue 39's ``speed=max`` goal (segscale at least 1.35× this loop) and of
its time to the first step: the same network as measure.py's runs (DeepLabV3+ ResNet-50,
output stride 16, 128 decoder channels, 6 classes, random weights), the same patches
(512² crops of the embedded synthetic tiles, at a uniform random place, with the default
run's rotation and translation by albumentations, normalized with ImageNet's mean and
std), the same workers and batch, channels_last, SGD with momentum 0.9 and weight decay
1e-4, cross-entropy ignoring 255, and cuDNN's search on (train.py's default), eager.
Steps are clocked as measure.py's are: one CUDA event at the end of each, read at the
end. It writes the steady step and the phases before the first step, timed from the
process's start (read from /proc, so the interpreter's start and the imports count).
"""

from __future__ import annotations

import time

PROCESS_START = time.time()  # replaced by the kernel's record below, where there is one

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
from pathlib import Path  # noqa: E402

import albumentations as A  # noqa: E402
import numpy as np  # noqa: E402
import segmentation_models_pytorch as smp  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

IMPORTED = time.time()
PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def process_start(fallback: float = PROCESS_START) -> float:
    """The start of this process on the wall clock, from /proc (Linux), else ``fallback``.

    ``fallback`` (default: this script's start) is the calling script's own start.
    """
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return fallback


class RandomPatches(Dataset):
    """``length`` random ``size``² patches of the tiles in ``folder``/train."""

    def __init__(self, folder: Path, size: int, length: int) -> None:
        names = sorted((folder / "train" / "images").glob("*.png"))
        if not names:
            raise SystemExit(f"{folder}/train/images holds no PNG tiles: run python train.py once")
        self.images = [np.asarray(Image.open(name).convert("RGB")) for name in names]
        self.masks = [np.asarray(Image.open(folder / "train" / "masks" / n.name)) for n in names]
        self.size, self.length = size, length
        self.transform = A.Compose(
            [
                A.Affine(
                    rotate=(-20, 20),
                    translate_px={"x": (-10, 10), "y": (-10, 10)},
                    fill_mask=255,
                    p=1.0,
                ),
                A.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
            ]
        )

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng()
        tile = int(rng.integers(len(self.images)))
        image, mask = self.images[tile], self.masks[tile]
        top = int(rng.integers(image.shape[0] - self.size + 1))
        left = int(rng.integers(image.shape[1] - self.size + 1))
        window = (slice(top, top + self.size), slice(left, left + self.size))
        out = self.transform(image=image[window], mask=mask[window])
        patch = torch.from_numpy(out["image"].transpose(2, 0, 1).copy())
        return patch, torch.from_numpy(out["mask"].astype(np.int64))


def main() -> None:
    """Train ``--warmup`` + ``--steps`` steps; write the steady step and the start-up phases."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--data", type=Path, default=None, help="a synthetic set's folder")
    parser.add_argument("--precision", choices=list(PRECISIONS), default="bf16")
    parser.add_argument("--steps", type=int, default=70, help="steps in all")
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the mean")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--encoder", default="resnet50")
    args = parser.parse_args()
    phases: dict[str, float] = {}
    started = process_start()
    phases["python, imports"] = IMPORTED - started
    mark = IMPORTED

    def phase(name: str) -> None:
        nonlocal mark
        now = time.time()
        phases[name] = now - mark
        mark = now

    data = args.data or next(Path("data/synthetic").glob("v*"))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True
    dataset = RandomPatches(data, args.size, args.batch * (args.steps + 1))
    phase("data")
    network = smp.DeepLabV3Plus(args.encoder, encoder_weights=None, classes=6, decoder_channels=128)
    network = network.to(device, memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(network.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)
    phase("model, optimizer")
    loader = DataLoader(
        dataset,
        batch_size=args.batch,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=args.workers > 0,
        prefetch_factor=2 if args.workers else None,
        drop_last=True,
    )
    dtype = PRECISIONS[args.precision]
    scaler = torch.amp.GradScaler(enabled=dtype == torch.float16)
    events: list = []
    for step, (image, mask) in enumerate(loader):
        if step == 0:
            phase("workers and first batch")
        image = image.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        mask = mask.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(network(image), mask, ignore_index=255)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            events.append(torch.cuda.Event(enable_timing=True))
            events[-1].record()
        else:
            events.append(time.perf_counter())
        if step == 0:
            if device.type == "cuda":
                torch.cuda.synchronize()
            phase("first step")
        if step + 1 == args.steps:
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
        durations = [a.elapsed_time(b) / 1000 for a, b in itertools.pairwise(events)]
    else:
        durations = [b - a for a, b in itertools.pairwise(events)]
    steady = statistics.fmean(durations[args.warmup :])
    result = {
        "settings": vars(args) | {"out": str(args.out), "data": str(data)},
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU",
        "step_ms": 1000 * steady,
        "patches_per_s": args.batch / steady,
        "time_to_first_step_s": sum(phases.values()),
        "startup_phases_s": {name: round(seconds, 3) for name, seconds in phases.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
