"""What the decode cache's checks cost against decoding the source they stand for.

Writes a 2048x2048 RGB PNG of camera-like content (smooth structure at three scales
and sensor noise) and a 2048x2048 mask PNG of five classes in blobs, builds each one's
decode-cache entry, then times, ``--repeats`` times each, alternating:

- decoding the PNG (Pillow, what building an entry costs);
- mapping its entry as every ``DecodeCache.open`` does (record read, ``np.load`` with
  ``mmap_mode``, the XXH3-128 digest of the pixels compared), the same without the
  digest (as the cache mapped before it had one), and the digest alone;
  SHA-256 and BLAKE2b over the same bytes, the hashlib alternatives;
- the source's identity (``source_identity``: one ``os.stat``) and, as Windows adds it,
  the digest of the source file's bytes.

Prints a table of medians (min-max) and writes every time into ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from segscale.atomic_files import write_text_atomically
from segscale.data.storage import decode_cache
from segscale.data.storage.caches import content_digest, source_identity
from segscale.data.storage.decode_cache import DecodeCache

SIDE = 2048


def camera_like(rng: np.random.Generator) -> np.ndarray:
    """An RGB image that compresses like a photograph: smooth structure and noise."""
    layers = []
    for scale in (8, 32, 128):
        coarse = rng.normal(size=(SIDE // scale, SIDE // scale, 3)).astype(np.float32)
        channels = [
            np.asarray(Image.fromarray(coarse[..., c]).resize((SIDE, SIDE), Image.BICUBIC))
            for c in range(3)
        ]
        layers.append(np.stack(channels, axis=-1) * scale**0.5)
    smooth = sum(layers)
    smooth = (smooth - smooth.min()) / (smooth.max() - smooth.min()) * 220
    return np.clip(smooth + rng.normal(0, 4, smooth.shape), 0, 255).astype(np.uint8)


def blob_mask(rng: np.random.Generator) -> np.ndarray:
    """Five classes in blobs, as a land-cover mask."""
    coarse = rng.normal(size=(SIDE // 64, SIDE // 64)).astype(np.float32)
    smooth = np.asarray(Image.fromarray(coarse).resize((SIDE, SIDE), Image.BICUBIC))
    return np.digitize(smooth, np.quantile(smooth, [0.2, 0.4, 0.6, 0.8])).astype(np.uint8)


def timed(work: Callable[[], object]) -> float:
    """Seconds ``work`` takes once."""
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def measure(folder: Path, repeats: int) -> dict:
    """Every timing, for the image and the mask."""
    rng = np.random.default_rng(0)
    results: dict = {}
    cache = DecodeCache(str(folder / "cache"))
    for name, pixels in (("image", camera_like(rng)), ("mask", blob_mask(rng))):
        path = folder / f"{name}.png"
        Image.fromarray(pixels).save(path)

        def decode(path: Path = path) -> np.ndarray:
            return np.asarray(Image.open(path))

        mapped = cache.open(path, name, decode)
        assert isinstance(mapped, np.memmap)
        identity = {
            "format": decode_cache.FORMAT,
            "source": str(path.resolve()),
            "variant": name,
            "file": source_identity(path),
        }
        key = decode_cache._key(identity)

        def mapping(key: str = key, identity: dict = identity) -> None:
            assert decode_cache._mapped(cache.store, key, identity)[0] is not None

        def unchecked(key: str = key) -> None:
            json.loads((cache.store / f"{key}.json").read_text())
            np.load(cache.store / f"{key}.npy", mmap_mode="r", allow_pickle=False)

        ways: dict[str, Callable[[], object]] = {
            "decode the PNG": decode,
            "map the entry, digest checked (DecodeCache.open)": mapping,
            "map the entry, no digest (as before)": unchecked,
            "the digest alone (XXH3-128)": lambda m=mapped: decode_cache._digest(m),
            "SHA-256 of the pixels": lambda m=mapped: hashlib.sha256(m).digest(),
            "BLAKE2b of the pixels": lambda m=mapped: hashlib.blake2b(m).digest(),
            "the source's identity (os.stat)": lambda p=path: source_identity(p),
            "the source file's digest (Windows' identity)": lambda p=path: content_digest(p),
        }
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(repeats):
            for way, work in ways.items():
                times[way].append(timed(work))
        results[name] = {
            "png_bytes": path.stat().st_size,
            "decoded_bytes": int(pixels.nbytes),
            "seconds": times,
        }
    return results


def table(results: dict) -> str:
    """The README's table: medians (min-max), and each as a share of decoding."""
    lines = [
        "| | image: ms | share of decoding | mask: ms | share of decoding |",
        "|---|---|---|---|---|",
    ]
    for way in results["image"]["seconds"]:
        cells = []
        for name in ("image", "mask"):
            seconds = results[name]["seconds"]
            median = statistics.median(seconds[way])
            decode = statistics.median(seconds["decode the PNG"])
            low, high = min(seconds[way]), max(seconds[way])
            cells.append(f"{median * 1e3:.3g} ({low * 1e3:.3g}–{high * 1e3:.3g})")
            cells.append(f"{median / decode:.1%}")
        lines.append(f"| {way} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    """Measure, print the table, write the times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    parser.add_argument("--table", type=Path, help="print the table of a stored results file")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())["results"]))
        return
    with tempfile.TemporaryDirectory() as folder:
        os.environ["XDG_CACHE_HOME"] = folder
        results = measure(Path(folder), args.repeats)
    record = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "python": sys.version.split()[0],
        "load_average_after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "results": results,
    }
    write_text_atomically(args.out, json.dumps(record, indent=1))
    for name in ("image", "mask"):
        png, decoded = results[name]["png_bytes"], results[name]["decoded_bytes"]
        print(f"{name}: {png / 1e6:.2f} MB PNG, {decoded / 1e6:.2f} MB decoded")
    print(table(results))


if __name__ == "__main__":
    main()
