"""The GPU measurements of experiments/gpu/README.md, in one process tree.

    python3 experiments/gpu/measure.py OUT [--baseline SRC] [--steps N]
    python3 experiments/gpu/measure.py results/<file>.json --table

For each source tree (this checkout's ``src``, and with ``--baseline`` another version's,
e.g. ``git archive <commit> src | tar -x -C .baseline``) and each precision, a real
``train.py`` run of DeepLabV3+ ResNet-50, 512² patches, batch 16, channels_last (the
configuration of the issue that found bf16 slower than fp16) is clocked step by step
with CUDA events (steady_clock.py); the steady step is the mean after the first
``--warmup`` steps. Then ``bench.py`` (this checkout) measures the same bf16 config's
step in its compute section and its own one-device train.py run, and the table compares
them. Results: OUT/measure.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PRECISIONS = ("bf16-mixed", "16-mixed", "32-true")
BATCH = 16
CONFIG = [
    "model.encoder=resnet50",
    "datamodule.patch_size=512",
    f"datamodule.batch_size={BATCH}",
    "datamodule.num_workers=8",
    "training.channels_last=true",
    "trainer.accelerator=gpu",
    "trainer.devices=1",
]


def environment(source: Path) -> dict[str, str]:
    """The environment of a run of the source tree ``source`` (its ``src`` first)."""
    path = [str(source), str(HERE), os.environ.get("PYTHONPATH", "")]
    return os.environ | {"PYTHONPATH": os.pathsep.join(p for p in path if p)}


def steady_run(source: Path, variant: str, steps: int, warmup: int, out: Path) -> dict:
    """One clocked train.py run; its steady step, rate and time to the first step.

    ``variant`` is a precision (``bf16-mixed``) or a preset override (``speed=max``).
    """
    record = out / "steps.json"
    command = [
        sys.executable,
        str(REPO / "train.py"),
        *CONFIG,
        variant if "=" in variant else f"trainer.precision={variant}",
        f"++trainer.max_steps={steps}",
        "++trainer.max_epochs=-1",
        "++trainer.limit_val_batches=0",
        "++trainer.num_sanity_val_steps=0",
        "++trainer.enable_checkpointing=false",
        "callbacks=none",
        "logger=none",
        "+callbacks.clock._target_=steady_clock.SteadyClock",
        f"+callbacks.clock.path={record}",
        f"hydra.run.dir={out}",
    ]
    start = time.perf_counter()
    done = subprocess.run(command, env=environment(source), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode or not record.is_file():
        return {"error": (done.stderr or done.stdout)[-1500:]}
    clocked = json.loads(record.read_text())
    steady = statistics.fmean(clocked["durations_s"][warmup:])
    return {
        "step_ms": 1000 * steady,
        "patches_per_s": BATCH / steady,
        "first_step_s": clocked["first_step_s"],
        "wall_s": wall,
    }


def median_run(runs: list[dict]) -> dict:
    """The run of median steady step among ``runs`` (an error if none finished).

    Every run's step is kept as ``step_ms_samples``.
    """
    finished = sorted((r for r in runs if "step_ms" in r), key=lambda r: r["step_ms"])
    if not finished:
        return runs[-1]
    median = dict(finished[(len(finished) - 1) // 2])
    return median | {"step_ms_samples": [r["step_ms"] for r in finished]}


def bench_comparison(out: Path) -> dict:
    """bench.py's bf16 compute step, bare step and its one-device train.py run's step."""
    folder = out / "bench"
    command = [
        sys.executable,
        str(REPO / "bench.py"),
        *CONFIG,
        "trainer.precision=bf16-mixed",
        "bench.options=[]",
        "bench.workers=[8]",
        "bench.seconds=0.5",
        "bench.devices=[1]",
        "bench.window_steps=20",
        "bench.overhead_rounds=3",
        "bench.overhead_steps=200",
        f"hydra.run.dir={folder}",
    ]
    done = subprocess.run(command, env=environment(REPO / "src"), capture_output=True, text=True)
    (out / "bench.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        return {"error": (done.stderr or done.stdout)[-1500:]}
    compute = json.loads((folder / "bench.json").read_text())["compute"]
    return {
        "lightning_step_ms": 1000 * compute["lightning"]["mean_s"],
        "bare_step_ms": 1000 * compute["bare"]["step"]["mean_s"],
        "run_step_ms": 1000 * compute["run_step_s"] if compute.get("run_step_s") else None,
        "step_vs_run": compute.get("step_vs_run"),
        "overhead_ms": compute["overhead"]["overhead_ms"],
    }


def main() -> None:
    """Measure; print the table; write OUT/measure.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--baseline", type=Path, help="another version's src folder")
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each, alternating")
    parser.add_argument("--no-bench", action="store_true")
    parser.add_argument(
        "--set", nargs="*", default=[], help="overrides after the config's (a CPU dry run)"
    )
    parser.add_argument("--table", action="store_true", help="print OUT's table (a JSON file)")
    args = parser.parse_args()
    if args.table:
        print_table(json.loads(args.out.read_text()))
        return
    CONFIG.extend(args.set)
    args.out.mkdir(parents=True, exist_ok=True)
    sources = {"this": REPO / "src"}
    if args.baseline:
        sources = {"baseline": args.baseline.resolve(), **sources}
    results: dict = {"config": CONFIG, "runs": {}}
    for precision in PRECISIONS:
        samples: dict[str, list[dict]] = {name: [] for name in sources}
        for repeat in range(args.repeats):
            # Alternate which source goes first: a fresh machine's first runs load
            # libraries and kernels cold.
            order = list(sources) if repeat % 2 == 0 else list(reversed(sources))
            for name in order:
                folder = args.out / f"{name}-{precision}-{repeat}"
                run = steady_run(sources[name], precision, args.steps, args.warmup, folder)
                samples[name].append(run)
                print(f"{name} {precision} #{repeat}", run, flush=True)
        for name, runs in samples.items():
            results["runs"][f"{name} {precision}"] = median_run(runs)
    # The fast path in one switch (this version's preset), against the rows above.
    samples = []
    for repeat in range(args.repeats):
        folder = args.out / f"this-speed-max-{repeat}"
        samples.append(steady_run(REPO / "src", "speed=max", args.steps, args.warmup, folder))
        print(f"this speed=max #{repeat}", samples[-1], flush=True)
    results["runs"]["this speed=max"] = median_run(samples)
    if not args.no_bench:
        results["bench"] = bench_comparison(args.out)
        print("bench", results["bench"], flush=True)
    (args.out / "measure.json").write_text(json.dumps(results, indent=2))
    print_table(results)


def print_table(results: dict) -> None:
    """The table of a measure.json (or a results/*.json of the same shape)."""
    print("\n| source | precision | steady step (ms) | patches/s | first step (s) |")
    print("|---|---|---|---|---|")
    sources = []
    for key, run in results["runs"].items():
        name, precision = key.split(" ")
        if name not in sources:
            sources.append(name)
        if "error" in run:
            print(f"| {name} | {precision} | failed: {run['error'][-200:]!r} | | |")
            continue
        print(
            f"| {name} | {precision} | {run['step_ms']:.1f} | {run['patches_per_s']:.0f} "
            f"| {run['first_step_s']:.1f} |"
        )
    for name in sources:
        bf16, fp16 = (results["runs"].get(f"{name} {p}", {}) for p in PRECISIONS[:2])
        if "step_ms" in bf16 and "step_ms" in fp16:
            print(f"{name}: bf16-mixed / 16-mixed rate = {fp16['step_ms'] / bf16['step_ms']:.3f}")
    bench = results.get("bench")
    if bench and "error" not in bench:
        print(
            f"bench (bf16): Lightning step {bench['lightning_step_ms']:.1f} ms, bare "
            f"{bench['bare_step_ms']:.1f} ms, its train.py run {bench['run_step_ms']:.1f} ms, "
            f"bench / run = {bench['step_vs_run']:.3f}; framework overhead "
            f"{bench['overhead_ms']:.2f} ms per step"
        )
        this = results["runs"].get("this bf16-mixed", {})
        if "step_ms" in this:
            ratio = bench["lightning_step_ms"] / this["step_ms"]
            print(f"bench's Lightning step / this bf16-mixed run's steady step = {ratio:.3f}")
    elif bench:
        print("bench failed:", bench["error"][-500:])


if __name__ == "__main__":
    main()
