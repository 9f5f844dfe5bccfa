"""The GPU measurements of experiments/gpu/README.md, in one process tree.

    python3 experiments/gpu/measure.py OUT [--baseline SRC] [--steps N] [--sections LIST]
    python3 experiments/gpu/measure.py results/<file>.json --table

For each source tree (this checkout's ``src``, and with ``--baseline`` another version's,
e.g. ``git archive <commit> src | tar -x -C .baseline``) and each precision, a real
``train.py`` run of DeepLabV3+ ResNet-50, 512² patches, batch 16, channels_last (the
configuration of the issue that found bf16 slower than fp16) is clocked step by step
with CUDA events (steady_clock.py); the steady step is the mean after the first
``--warmup`` steps. Then ``bench.py`` (this checkout) measures the same bf16 config's
step in its compute section and its own one-device train.py run, and the table compares
them. The options section runs ``speed=max`` less one option at a time; the loop section
``handwritten_loop.py``, the same training written by hand. The DDP section runs the
bf16 config on one device as a single-device run and as one-rank ``strategy=ddp`` runs
with each of DDP's options. Every run's last ``--profile-steps`` steps (after the timed
ones) run under torch.profiler (``profile.txt`` in its folder). ``--sections`` picks
among the sections and orders them.
Results: OUT/measure.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
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


def setting(key: str) -> str:
    """The value ``CONFIG`` gives ``key`` (its last override of it: ``--set`` comes last)."""
    return [item.split("=", 1)[1] for item in CONFIG if item.split("=", 1)[0] == key][-1]


def environment(source: Path) -> dict[str, str]:
    """The environment of a run of the source tree ``source`` (its ``src`` first)."""
    path = [str(source), str(HERE), os.environ.get("PYTHONPATH", "")]
    return os.environ | {"PYTHONPATH": os.pathsep.join(p for p in path if p)}


DDP_VARIANTS = {
    "single": [],
    "ddp": ["strategy=ddp"],
    "ddp gradient_as_bucket_view": ["strategy=ddp", "+strategy.gradient_as_bucket_view=true"],
    "ddp static_graph": ["strategy=ddp", "+strategy.static_graph=true"],
    "ddp broadcast_buffers=false": ["strategy=ddp", "+strategy.broadcast_buffers=false"],
}
"""Issue 39's one-rank DDP step against the single-device one: the same bf16 config,
clocked alike, then DDP's options one at a time (each a keyword of
``DistributedDataParallel``, which Lightning's ``DDPStrategy`` passes on)."""

SPEED_OPTIONS = {
    "speed=max": [],
    "less channels_last": ["training.channels_last=false"],
    "less the fused optimizer": ["optimizer.fused=false"],
    "less cuDNN's search": ["trainer.benchmark=false"],
    "with training.compile": ["training.compile=true"],
}
"""Issue 39's table of what each option of ``speed=max`` contributes: the preset, then the
preset less one option at a time (compile added, as the preset leaves it out)."""

SECTIONS = ("precisions", "options", "loop", "ddp", "bench")


def steady_run(
    source: Path,
    variant: str | list[str],
    steps: int,
    warmup: int,
    out: Path,
    profile_steps: int = 0,
) -> dict:
    """One clocked train.py run; its steady step, rate and time to the first step.

    ``variant`` is a precision (``bf16-mixed``), a preset override (``speed=max``) or a
    list of overrides. ``profile_steps``: the last that many steps run under
    torch.profiler, its table written to ``out/profile.txt``, and are left out of the
    steady step.
    """
    record = out / "steps.json"
    if isinstance(variant, str):
        variant = [variant if "=" in variant else f"trainer.precision={variant}"]
    # The profiled steps are the last ones, left out of the steady step.
    profile_from = steps - profile_steps
    profiled = [
        f"+callbacks.clock.profile_from={profile_from}",
        f"+callbacks.clock.profile_steps={profile_steps}",
    ]
    command = [
        sys.executable,
        str(REPO / "train.py"),
        *CONFIG,
        *variant,
        f"++trainer.max_steps={steps}",
        "++trainer.max_epochs=-1",
        "++trainer.limit_val_batches=0",
        "++trainer.num_sanity_val_steps=0",
        "++trainer.enable_checkpointing=false",
        "callbacks=none",
        "logger=none",
        "+callbacks.clock._target_=steady_clock.SteadyClock",
        f"+callbacks.clock.path={record}",
        *(profiled if profile_steps else []),
        f"hydra.run.dir={out}",
    ]
    start = time.perf_counter()
    done = subprocess.run(command, env=environment(source), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode or not record.is_file():
        return {"error": (done.stderr or done.stdout)[-1500:]}
    clocked = json.loads(record.read_text())
    summary = out / "summary.json"  # segscale's own start-up phases, from process start
    phases = json.loads(summary.read_text()) if summary.is_file() else {}
    # durations_s[i] ends at step i + 1: the profiled steps' durations start at profile_from - 1
    timed = clocked["durations_s"][warmup : profile_from - 1 if profile_steps else None]
    steady = statistics.fmean(timed)
    return {
        "step_ms": 1000 * steady,
        "patches_per_s": int(setting("datamodule.batch_size")) / steady,
        "first_step_s": clocked["first_step_s"],
        "wall_s": wall,
        "time_to_first_step_s": phases.get("time_to_first_step_s"),
        "startup_phases_s": phases.get("startup_phases_s"),
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
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"which of {','.join(SECTIONS)} to run"
    )
    parser.add_argument(
        "--profile-steps", type=int, default=5, help="steps after the timed ones, profiled"
    )
    parser.add_argument(
        "--set", nargs="*", default=[], help="overrides after the config's (a CPU dry run)"
    )
    parser.add_argument("--table", action="store_true", help="print OUT's table (a JSON file)")
    args = parser.parse_args()
    if args.table:
        print_table(json.loads(args.out.read_text()))
        return
    sections = args.sections.split(",")
    if unknown := set(sections) - set(SECTIONS):
        parser.error(f"--sections: {sorted(unknown)} are not among {','.join(SECTIONS)}")
    CONFIG.extend(args.set)
    args.out.mkdir(parents=True, exist_ok=True)
    sources = {"this": REPO / "src"}
    if args.baseline:
        sources = {"baseline": args.baseline.resolve(), **sources}
    results: dict = {"config": CONFIG, "runs": {}}
    for section in sections:  # in the order asked, the results saved after each
        if section == "precisions":
            results["runs"] |= precision_runs(args, sources)
        elif section == "options":  # the fast path in one switch, and each of its options
            results["options"] = options_comparison(args)
            results["runs"]["this speed=max"] = results["options"]["speed=max"]
        elif section == "loop":
            results["loop"] = handwritten_loop(args.out / "loop", args.steps, args.warmup)
            print("hand-written loop", results["loop"], flush=True)
        elif section == "ddp":
            results["ddp"] = ddp_comparison(args)
        elif section == "bench":
            results["bench"] = bench_comparison(args.out)
            print("bench", results["bench"], flush=True)
        (args.out / "measure.json").write_text(json.dumps(results, indent=2))
    print_table(results)


def profiled_run(
    args: argparse.Namespace, source: Path, variant: str | list[str], folder: Path
) -> dict:
    """``steady_run`` of ``--steps`` timed steps, then ``--profile-steps`` profiled ones."""
    steps = args.steps + args.profile_steps
    return steady_run(source, variant, steps, args.warmup, folder, args.profile_steps)


def precision_runs(args: argparse.Namespace, sources: dict[str, Path]) -> dict[str, dict]:
    """Each source in each of ``PRECISIONS``: the median of ``--repeats`` runs."""
    runs: dict[str, dict] = {}
    for precision in PRECISIONS:
        variants = {f"{name} {precision}": (source, precision) for name, source in sources.items()}
        runs |= compared_runs(args, variants)
    return runs


def compared_runs(
    args: argparse.Namespace, variants: dict[str, tuple[Path, str | list[str]]], prefix: str = ""
) -> dict[str, dict]:
    """The median of ``--repeats`` profiled runs of each of ``variants`` (name: source, variant).

    The order alternates from one repeat to the next: a fresh machine's first runs load
    libraries and kernels cold.
    """
    samples: dict[str, list[dict]] = {name: [] for name in variants}
    for repeat in range(args.repeats):
        order = list(variants) if repeat % 2 == 0 else list(reversed(variants))
        for name in order:
            source, variant = variants[name]
            folder = args.out / f"{prefix}{folder_name(name)}-{repeat}"
            samples[name].append(run := profiled_run(args, source, variant, folder))
            print(f"{name} #{repeat}", run, flush=True)
    return {name: median_run(runs) for name, runs in samples.items()}


def folder_name(name: str) -> str:
    """``name`` with only letters, digits, ``_`` and ``-``: a run folder's name.

    Hydra's override grammar takes no ``=`` in ``hydra.run.dir``.
    """
    return "".join(c if c.isalnum() or c == "_" else "-" for c in name)


def options_comparison(args: argparse.Namespace) -> dict[str, dict]:
    """``speed=max`` and each of ``SPEED_OPTIONS``."""
    variants = {name: (REPO / "src", ["speed=max", *o]) for name, o in SPEED_OPTIONS.items()}
    return compared_runs(args, variants, "options-")


def handwritten_loop(out: Path, steps: int, warmup: int) -> dict:
    """handwritten_loop.py in bf16 with the runs' network, patches, batch and workers."""
    command = [
        sys.executable,
        str(HERE / "handwritten_loop.py"),
        str(out / "loop.json"),
        "--precision=bf16",
        f"--steps={steps}",
        f"--warmup={warmup}",
        f"--encoder={setting('model.encoder')}",
        f"--size={setting('datamodule.patch_size')}",
        f"--batch={setting('datamodule.batch_size')}",
        f"--workers={setting('datamodule.num_workers')}",
    ]
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    (out / "loop.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        return {"error": (done.stderr or done.stdout)[-1500:]}
    return json.loads((out / "loop.json").read_text())


def ddp_comparison(args: argparse.Namespace) -> dict[str, dict]:
    """Each of ``DDP_VARIANTS`` in bf16-mixed, alternating their order per repeat.

    Every run profiles its last ``--profile-steps`` steps (``<folder>/profile.txt``, the
    ops by their own time on the device), left out of its steady step.
    """
    src = REPO / "src"
    variants = {
        name: (src, ["trainer.precision=bf16-mixed", *overrides])
        for name, overrides in DDP_VARIANTS.items()
    }
    return compared_runs(args, variants, "ddp-")


def print_table(results: dict) -> None:
    """The table of a measure.json (or a results/*.json of the same shape)."""
    if results["runs"]:
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
    loop, options = results.get("loop"), results.get("options")
    if options:
        base = loop.get("step_ms") if loop else None
        head = "| speed=max, one option at a time | steady step (ms) | speed-up over the loop |"
        print_rows(head, options, lambda step: f"{base / step:.3f}" if base else "")
    if loop and "step_ms" in loop:
        print(
            f"hand-written eager bf16 loop: {loop['step_ms']:.1f} ms per step, "
            f"{loop['patches_per_s']:.0f} patches/s, first step after "
            f"{loop['time_to_first_step_s']:.1f} s: {loop['startup_phases_s']}"
        )
    elif loop:
        print("hand-written loop failed:", loop["error"][-500:])
    for key, run in results["runs"].items():
        if run.get("startup_phases_s"):
            phases = ", ".join(f"{k} {v:.1f}" for k, v in run["startup_phases_s"].items())
            print(f"{key}: first step after {run['time_to_first_step_s']:.1f} s: {phases}")
    ddp = results.get("ddp")
    if ddp:
        single = ddp.get("single", {}).get("step_ms")
        head = "| one rank, bf16-mixed | steady step (ms) | / single device |"
        print_rows(head, ddp, lambda step: f"{step / single:.3f}" if single else "")


def print_rows(head: str, runs: dict[str, dict], ratio: Callable[[float], str]) -> None:
    """A table of ``runs``' steady steps under ``head``, each with ``ratio(step)``."""
    print("\n" + head)
    print("|---|---|---|")
    for name, run in runs.items():
        if "step_ms" not in run:
            print(f"| {name} | failed: {run.get('error', '')[-200:]!r} | |")
            continue
        print(f"| {name} | {run['step_ms']:.1f} | {ratio(run['step_ms'])} |")


if __name__ == "__main__":
    main()
