"""segscale's training step against the hand-written loop on CamVid, in alternating pairs.

    python experiments/step-overhead/measure.py --root /tmp/camvid/CamVid \
        --work /tmp/step-overhead \
        [--pairs 4] [--load 0] [--profile] [--extra key=value ...]

Each pair runs ``loop.py`` and ``train.py`` (the README's command) one after the other,
the first of the pair alternating; ``--load N`` keeps N single-threaded busy processes
running beside both (a machine shared with other work). ``--profile`` runs train.py
under Lightning's simple profiler (``trainer.profiler=simple``) and keeps its table.
``--extra`` adds train.py overrides; ``--before`` runs another checkout's train.py
(the code before a change) in each pair too, so that a change's before and after are
measured in one run; ``--threads`` samples the running threads of each process of
each run (the training process, each DataLoader worker) every 50 ms; ``--first-run``
gives each train.py run empty caches (its first run on a machine: the decode cache and
the dataset check's cache filled by the run).
Writes ``pairs.json`` under ``--work`` and prints a line per pair: patches/s over all
60 steps and steady (after the first tenth) and the time to the first step of each run;
then the median and range of train.py's steady rate and first-step time over the loop's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

from segscale.bench.measure.overhead import step_terms

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def train_command(
    checkout: Path, root: Path, run_dir: Path, extra: list[str], profile: bool
) -> list[str]:
    """The README's train.py command on CamVid, into ``run_dir``, of ``checkout``."""
    command = [
        sys.executable,
        str(checkout / "train.py"),
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "datamodule.source.splits.train={images:train,masks:trainannot}",
        "datamodule.source.splits.val={images:val,masks:valannot}",
        "datamodule/classes=auto",
        "datamodule.ignore_ids=[11]",
        "datamodule.patch_size=256",
        "datamodule.patches_per_image=2",
        "datamodule.batch_size=8",
        "datamodule.num_workers=1",
        "model=deeplabv3plus",
        "model.encoder=resnet18",
        "model.encoder_weights=null",
        "optimizer.lr=0.03",
        "trainer.max_steps=60",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=0",
        "trainer.num_sanity_val_steps=0",
        "trainer.accelerator=cpu",
        "training.threads=2",
        "seed=0",
        f"hydra.run.dir={run_dir}",
    ]
    if profile:
        command.append("trainer.profiler=simple")
    return command + extra


def busy(stop: multiprocessing.synchronize.Event) -> None:
    """One core's worth of work until ``stop``: another user's job on a shared machine."""
    value = 0
    while not stop.is_set():
        for i in range(100_000):
            value += i * i


def running_threads(pid: int) -> int:
    """How many of process ``pid``'s threads are running or runnable now (Linux's /proc)."""
    count = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            count += stat.read_text().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            continue
    return count


def run_watched(command: list[str], watch: bool, **options) -> dict:
    """Run ``command`` to its end (``check``); with ``watch``, its processes sampled.

    Every 50 ms: the running threads of the process and of each of its descendants (the
    DataLoader workers), and their CPU time so far. Returns each role's most and 95th
    percentile of running threads, and its CPU seconds (user, system) at the last sample.
    """
    process = subprocess.Popen(command, **options)
    samples: dict[str, list[int]] = {"main": [], "each worker": []}
    cpu: dict[int, tuple[str, float, float, int, int]] = {}  # pid → role, user, system s,
    # minor page faults, involuntary context switches
    while process.poll() is None:
        if watch:
            try:
                main = psutil.Process(process.pid)
                children = main.children(recursive=True)
            except psutil.Error:
                break
            for role, member in [("main", main)] + [("each worker", c) for c in children]:
                try:
                    times = member.cpu_times()
                    switches = member.num_ctx_switches().involuntary
                    faults = int(
                        Path(f"/proc/{member.pid}/stat").read_text().rsplit(")", 1)[1].split()[7]
                    )
                except (psutil.Error, OSError, IndexError, ValueError):
                    continue
                samples[role].append(running_threads(member.pid))
                cpu[member.pid] = (role, times.user, times.system, faults, switches)
        time.sleep(0.05)
    if process.wait():
        raise subprocess.CalledProcessError(process.returncode, command)
    found = {}
    for role, values in samples.items():
        if values:
            found[role] = {
                "most": max(values),
                "p95": sorted(values)[int(0.95 * (len(values) - 1))],
                "cpu_user_s": round(sum(c[1] for c in cpu.values() if c[0] == role), 1),
                "cpu_system_s": round(sum(c[2] for c in cpu.values() if c[0] == role), 1),
                "minor_faults": sum(c[3] for c in cpu.values() if c[0] == role),
                "involuntary_switches": sum(c[4] for c in cpu.values() if c[0] == role),
            }
    return found


def run_loop(root: Path, out: Path, watch: bool) -> dict:
    """loop.py's result."""
    threads = run_watched(
        [sys.executable, str(HERE / "loop.py"), str(out), "--root", str(root)],
        watch,
        stdout=subprocess.DEVNULL,
    )
    result = json.loads(out.read_text())
    return {
        "patches_per_s": result["patches_per_s"],
        "steady": result["steady_patches_per_s"],
        "first_step_s": result["time_to_first_step_s"],
        "step_ms": result["step_ms"],
        "running_threads": threads,
    }


def run_segscale(
    checkout: Path,
    root: Path,
    run_dir: Path,
    extra: list[str],
    profile: bool,
    first: bool,
    watch: bool = False,
) -> dict:
    """train.py's summary (and the profiler's table); ``first``: with empty caches."""
    shutil.rmtree(run_dir, ignore_errors=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    environment = dict(os.environ, PYTHONPATH=str(checkout / "src"))
    if first:  # a first run: no decode cache, no dataset check's cache
        environment["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="caches-", dir=run_dir.parent)
    with log.open("w") as stream:
        threads = run_watched(
            train_command(checkout, root, run_dir, extra, profile),
            watch,
            cwd=checkout,
            stdout=stream,
            stderr=subprocess.STDOUT,
            env=environment,
        )
    if first:
        shutil.rmtree(environment["XDG_CACHE_HOME"])
    summary = yaml.safe_load((run_dir / "summary.json").read_text())
    result = {
        "patches_per_s": summary["throughput_patches_per_s"],
        "steady": summary["steady_patches_per_s"],
        "first_step_s": summary["time_to_first_step_s"],
        "startup_phases_s": summary["startup_phases_s"],
        "running_threads": threads,
    }
    if profile:
        text = log.read_text()
        table = text[text.find("FIT Profiler Report") :] if "FIT Profiler Report" in text else ""
        result["profile"] = table
        result["step_ms"] = step_terms(profiler_totals(table), 60)
    return result


def profiler_totals(table: str) -> dict[str, float]:
    """Seconds per action of a SimpleProfiler report (its "Total time" column)."""
    totals = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("Action", "Total"):
            try:
                totals[cells[0]] = float(cells[3])
            except ValueError:
                continue
    return totals


def table(files: list[Path]) -> str:
    """The README's rows of ``files`` (pairs.json): one per pair, then each file's medians."""
    lines = [
        "| file | pair | first | load | loop | segscale | before | segscale / loop | "
        "before / loop | first step: loop, segscale, before (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in files:
        pairs = json.loads(path.read_text())["pairs"]
        for row in pairs:
            runs = [w for w in ("loop", "segscale", "before") if w in row]
            rate = {w: f"{row[w]['steady']:.2f}" for w in runs}
            ratio = {w: f"{row[f'ratio_{w}']:.3f}" for w in runs[1:]}
            first = ", ".join(f"{row[w]['first_step_s']:.1f}" for w in runs)
            lines.append(
                f"| {path.name} | {row['pair']} | {row['first']} | {row['load']} | "
                f"{rate['loop']} | {rate['segscale']} | {rate.get('before', '-')} | "
                f"{ratio['segscale']} | {ratio.get('before', '-')} | {first} |"
            )
        for which in ("segscale", "before"):
            values = [row[f"ratio_{which}"] for row in pairs if f"ratio_{which}" in row]
            if values:
                lines.append(
                    f"| {path.name} | median of {len(values)} | | | | | | "
                    + (
                        f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"
                        if which == "segscale"
                        else ""
                    )
                    + " | "
                    + (
                        f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"
                        if which == "before"
                        else ""
                    )
                    + " | |"
                )
    processes = [
        "",
        "| file | pair | run | training process: running threads most (p95) | each worker: "
        "most (p95) | training process: system CPU s | minor page faults |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in files:
        for row in json.loads(path.read_text())["pairs"]:
            for which in ("loop", "segscale", "before"):
                watched = row.get(which, {}).get("running_threads") or {}
                if "main" not in watched:
                    continue
                main, worker = watched["main"], watched.get("each worker", {})
                processes.append(
                    f"| {path.name} | {row['pair']} | {which} | {main['most']} ({main['p95']}) | "
                    f"{worker.get('most', '-')} ({worker.get('p95', '-')}) | "
                    f"{main['cpu_system_s']} | {main['minor_faults'] / 1e6:.2f} M |"
                )
    if len(processes) > 3:
        lines += processes
    return "\n".join(lines)


def main() -> None:
    """Run the pairs; write pairs.json; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="CamVid, as the SegNet tutorial has it")
    parser.add_argument("--work", type=Path, help="where the runs and pairs.json go")
    parser.add_argument(
        "--table", nargs="+", type=Path, help="print the tables of pairs.json files"
    )
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the runs")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--extra", nargs="*", default=[])
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="another checkout (the code before a change): its train.py too",
    )
    parser.add_argument(
        "--first-run",
        action="store_true",
        help="each train.py run with empty caches (its first run on a machine)",
    )
    parser.add_argument(
        "--threads", action="store_true", help="sample each process's running threads (50 ms)"
    )
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return
    if args.root is None or args.work is None:
        parser.error("--root and --work are needed to measure")
    args.work.mkdir(parents=True, exist_ok=True)
    stop = multiprocessing.Event()
    load = [
        multiprocessing.Process(target=busy, args=(stop,), daemon=True) for _ in range(args.load)
    ]
    for process in load:
        process.start()
    pairs = []
    try:
        for pair in range(args.pairs):
            runs = ["loop", "segscale"] + (["before"] if args.before else [])
            order = runs[pair % len(runs) :] + runs[: pair % len(runs)]
            row: dict = {"pair": pair + 1, "first": order[0], "load": args.load}
            for which in order:
                started = time.time()
                if which == "loop":
                    row["loop"] = run_loop(args.root, args.work / f"loop-{pair}.json", args.threads)
                else:
                    checkout = REPO if which == "segscale" else args.before
                    row[which] = run_segscale(
                        checkout,
                        args.root,
                        args.work / f"{which}-{pair}",
                        args.extra,
                        args.profile,
                        args.first_run,
                        args.threads,
                    )
                row[which]["wall_s"] = time.time() - started
            for which in runs[1:]:
                row[f"ratio_{which}"] = row[which]["steady"] / row["loop"]["steady"]
                row[f"ratio_all_steps_{which}"] = (
                    row[which]["patches_per_s"] / row["loop"]["patches_per_s"]
                )
                row[f"first_step_ratio_{which}"] = (
                    row[which]["first_step_s"] / row["loop"]["first_step_s"]
                )
            line = ", ".join(
                f"{which} {row[which]['patches_per_s']:.2f} ({row[which]['steady']:.2f}) "
                f"first step {row[which]['first_step_s']:.1f} s"
                for which in runs
            )
            print(f"pair {pair + 1} ({order[0]} first, load {args.load}): {line}", flush=True)
            pairs.append(row)
            out = args.work / "pairs.json"
            out.write_text(
                json.dumps({"settings": vars(args), "pairs": pairs}, indent=2, default=str)
            )
    finally:
        stop.set()
        for process in load:
            process.join()
    for which in ["segscale"] + (["before"] if args.before else []):
        for name in ("ratio", "first_step_ratio"):
            values = [row[f"{name}_{which}"] for row in pairs]
            print(
                f"{which} {name}: median {statistics.median(values):.3f}, "
                f"range {min(values):.3f}-{max(values):.3f}"
            )


if __name__ == "__main__":
    main()
