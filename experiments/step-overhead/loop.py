"""The CPU training loop a user would write by hand on CamVid: PyTorch + smp + albumentations.

    python experiments/step-overhead/loop.py OUT.json --root /tmp/camvid/CamVid \
        [--steps 60] [--threads 2] [--workers 1] [--profile]

The yardstick of issue 49: the work of the ``train.py`` command in this folder's README,
written without segscale (no Lightning, no Hydra). CamVid's 367 training images
(``train/``, masks ``trainannot/``, class 11 ignored) decoded into memory; per epoch 2
patches of 256² per image, each at a uniform random place, rotated ±20° and shifted
±10 px by albumentations (``fill_mask`` the ignored class), normalized with ImageNet's
mean and std; DeepLabV3+ ResNet-18 from scratch as train.py's model group builds it
(11 classes, output stride 16, 128 decoder channels), SGD 0.03 with momentum 0.9 and
weight decay 1e-4 on train.py's poly schedule (power 0.9), cross-entropy, batch 8, one
DataLoader worker, ``--threads`` intra-op threads.

Every step is split by this process's own clock into loader wait (``next`` on the
DataLoader), host-to-device copy, forward, loss, backward and optimizer step; the worker
times its own augmentation (``getitem_s``, off the training thread). ``--profile`` adds
torch.profiler's CPU op table of the steady steps. It writes the phases before the first
step (timed from the process's start, from /proc where there is one), the mean of each
step term over the steady steps (after the first tenth) and patches/s over every step.
"""

from __future__ import annotations

import time

PROCESS_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import albumentations as A  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402
import segmentation_models_pytorch as smp  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from handwritten_loop import process_start  # noqa: E402  (the GPU loop's, read the same way)

IMPORTED = time.time()
IGNORED = 11  # CamVid's "unlabelled"


class CamVidPatches(Dataset):
    """``per_image`` random ``size``² patches of each training image, augmented."""

    def __init__(self, root: Path, size: int, per_image: int) -> None:
        names = sorted((root / "train").glob("*.png"))
        if not names:
            raise SystemExit(f"{root}/train holds no PNG images: unpack CamVid there first")
        self.images = [np.asarray(Image.open(name).convert("RGB")) for name in names]
        self.masks = [np.asarray(Image.open(root / "trainannot" / name.name)) for name in names]
        self.size, self.per_image = size, per_image
        self.transform = A.Compose(
            [
                A.Affine(
                    rotate=(-20, 20),
                    translate_px={"x": (-10, 10), "y": (-10, 10)},
                    interpolation=cv2.INTER_LINEAR,
                    mask_interpolation=cv2.INTER_NEAREST,
                    fill_mask=IGNORED,
                    p=1.0,
                ),
                A.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
            ]
        )

    def __len__(self) -> int:
        return len(self.images) * self.per_image

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        started = time.perf_counter()
        rng = np.random.default_rng()
        image, mask = self.images[index // self.per_image], self.masks[index // self.per_image]
        top = int(rng.integers(image.shape[0] - self.size + 1))
        left = int(rng.integers(image.shape[1] - self.size + 1))
        window = (slice(top, top + self.size), slice(left, left + self.size))
        out = self.transform(image=image[window], mask=mask[window])
        patch = torch.from_numpy(np.ascontiguousarray(out["image"].transpose(2, 0, 1)))
        target = torch.from_numpy(out["mask"].astype(np.int64))
        return patch, target, time.perf_counter() - started


def main() -> None:
    """Train ``--steps`` steps; write the start-up phases and the per-step account."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--root", type=Path, required=True, help="CamVid as the SegNet tutorial has it"
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--per-image", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="torch.profiler's op table too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    phases: dict[str, float] = {}
    started = process_start(PROCESS_START)
    phases["python, imports"] = IMPORTED - started
    mark = IMPORTED

    def phase(name: str) -> None:
        nonlocal mark
        now = time.time()
        phases[name] = now - mark
        mark = now

    dataset = CamVidPatches(args.root, args.size, args.per_image)
    phase("data")
    network = smp.DeepLabV3Plus(
        "resnet18", encoder_weights=None, classes=11, encoder_output_stride=16, decoder_channels=128
    ).train()
    optimizer = torch.optim.SGD(network.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=args.steps, power=0.9)
    phase("model, optimizer")
    loader = DataLoader(
        dataset,
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        drop_last=True,
    )
    terms = ("loader wait", "host to device", "forward", "loss", "backward", "optimizer")
    account: list[dict[str, float]] = []
    profiler = None
    clock = time.perf_counter
    batches = iter(loader)
    first_step_at = None
    run_started = clock()
    for step in range(args.steps):
        if args.profile and step == max(1, args.steps // 10):
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            profiler.__enter__()
        times = {}
        t0 = clock()
        image, mask, getitem = next(batches)
        t1 = clock()
        image, mask = image.to("cpu"), mask.to("cpu")
        t2 = clock()
        logits = network(image)
        t3 = clock()
        loss = F.cross_entropy(logits, mask, ignore_index=IGNORED)
        t4 = clock()
        loss.backward()
        t5 = clock()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        t6 = clock()
        for name, (a, b) in zip(
            terms, [(t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5), (t5, t6)], strict=True
        ):
            times[name] = b - a
        times["step"] = t6 - t0
        times["getitem_s (worker)"] = float(getitem.sum())
        account.append(times)
        if step == 0:
            phase("workers and first batch, first step")
            first_step_at = time.time()
    ran = clock() - run_started
    if profiler is not None:
        profiler.__exit__(None, None, None)
    steady = account[max(1, args.steps // 10) :]
    result = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "patches_per_s": args.batch * args.steps / ran,
        "steady_patches_per_s": args.batch / statistics.fmean(t["step"] for t in steady),
        "time_to_first_step_s": (first_step_at or time.time()) - started,
        "startup_phases_s": {name: round(seconds, 3) for name, seconds in phases.items()},
        "step_ms": {
            name: round(1000 * statistics.fmean(t[name] for t in steady), 2) for name in steady[0]
        },
        "final_loss": float(loss.detach()),
    }
    if profiler is not None:
        result["profile"] = profiler.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=25
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "profile"}, indent=1))


if __name__ == "__main__":
    main()
