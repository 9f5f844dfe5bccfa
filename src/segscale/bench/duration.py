"""How long ``bench`` will take: planned from its config before it measures, then what it took.

bench's measurements are of two kinds. Some run for a time the config sets: each data
pipeline rate for ``bench.seconds`` (one core's three rates, the DataLoader at each
worker count, and the tiles as stored against in memory in ``storage.ROUNDS``
alternating rounds of two). The others run a number of training steps the config sets,
whose time is the network's step on this machine: the one-device step (``bench.windows``
rounds of the bare loop and of Lightning, ``bench.warmup_steps`` + ``bench.window_steps``
steps each), the performance options (``bench.warmup_steps`` + ``bench.option_steps``
each), the short ``train.py`` runs (``bench.warmup_steps`` + ``bench.window_steps`` ×
``bench.windows`` steps each, each stopped after ``bench.timeout_s``) and, on CPUs, the
two side-by-side runs; the framework's overhead runs ``bench.overhead_rounds`` ×
2 × ``bench.overhead_steps`` steps of a near-zero-compute network (milliseconds each).

Before anything is measured bench logs the plan (``DurationPlan.describe``): the timed
part in seconds, the steps, and the longest it may take (the ``train.py`` runs at their
timeout). Once the one-device step is measured, the steps have a time, and bench logs
its estimate of the whole (``DurationPlan.estimate_s``): each fresh process (every rank
of a ``train.py`` run, every side-by-side process) counted as long to start as bench's
own took, and on CPUs the steps of those runs at ``slowdown`` times the one-device step,
since their ranks split the cores (one thread each where the one device had two).
torch.compile's compilation (a ``compile`` option: tens of seconds on a CPU) is not
known before it runs and is said to be left out. At the end, what bench took.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from omegaconf import DictConfig

from segscale.bench.measure.overhead import WARMUP_STEPS as OVERHEAD_WARMUP
from segscale.bench.measure.storage import ROUNDS

ONE_CORE_RATES = 3
"""The data pipeline's rates on one core: the crop, crop + warp, the augmentation."""


@dataclass(frozen=True)
class DurationPlan:
    """What bench will run, from its config: timed rates, steps, ``train.py`` runs."""

    seconds: float  # bench.seconds: each timed rate
    timed_rates: int  # rates measured for `seconds` each
    step_runs: tuple[tuple[str, int, int], ...]  # (what, runs, steps each), in this process
    overhead_steps: int  # steps of the near-zero-compute network
    train_runs: int  # short train.py runs
    train_steps: int  # steps of each
    timeout_s: float  # bench.timeout_s: each train.py run at most
    process_starts: int  # fresh interpreters: every rank of the train.py and side-by-side runs
    shared_steps: int = 0  # of `steps`, those of runs whose ranks split the CPU's cores
    slowdown: float = 1.0  # their step against the one-device step (CPU: its threads / theirs)
    compiles: bool = False  # a compile option is measured (its compilation not estimated)

    def as_dict(self) -> dict[str, Any]:
        """Plain numbers and names (for ``bench.json``), the totals with them."""
        return asdict(self) | {"timed_total_s": self.timed_s, "steps_total": self.steps}

    @property
    def timed_s(self) -> float:
        """Seconds of the timed rates together."""
        return self.timed_rates * self.seconds

    @property
    def steps(self) -> int:
        """Training steps of the network in all (this process's and the train.py runs')."""
        in_process = sum(runs * steps for _, runs, steps in self.step_runs)
        return in_process + self.train_runs * self.train_steps

    def estimate_s(self, step_s: float, startup_s: float = 0.0) -> float:
        """The whole bench at ``step_s`` a step and ``startup_s`` to start a process."""
        stepping = (self.steps + self.shared_steps * (self.slowdown - 1)) * step_s
        return self.timed_s + stepping + self.process_starts * startup_s

    def longest_s(self, step_s: float | None = None) -> float:
        """The longest bench may take: every ``train.py`` run to its timeout.

        The steps in this process at ``step_s`` where known, else not counted.
        """
        in_process = sum(runs * steps for _, runs, steps in self.step_runs)
        return self.timed_s + in_process * (step_s or 0.0) + self.train_runs * self.timeout_s

    def describe(self) -> str:
        """The plan, as logged before measuring: what runs, for how long or how many steps."""
        parts = [
            f"{self.timed_rates} data-pipeline rates × bench.seconds={self.seconds:g} s "
            f"= {duration_text(self.timed_s)}"
        ]
        parts += [f"{what}: {runs} × {steps} steps" for what, runs, steps in self.step_runs]
        parts.append(f"framework overhead: {self.overhead_steps} steps of a near-zero network")
        if self.train_runs:
            parts.append(
                f"{self.train_runs} train.py run(s) × {self.train_steps} steps, each stopped "
                f"after bench.timeout_s={self.timeout_s:g} s"
            )
        bound = (
            f"; the train.py runs take at most {duration_text(self.train_runs * self.timeout_s)}"
            if self.train_runs
            else ""
        )
        return (
            f"bench will take {duration_text(self.timed_s)} of timed rates plus {self.steps} "
            f"training steps of this network (their time is known once the first are "
            f"measured{bound}): {'; '.join(parts)}"
        )

    def describe_rest(self, step_s: float, startup_s: float | None) -> str:
        """The estimate once the step is measured at ``step_s``.

        ``startup_s``: how long bench's own process took to start (the imports a
        ``train.py`` run repeats), ``None`` where unknown: then not counted.
        """
        starts = (
            f" + {self.process_starts} process start(s) × {startup_s:.0f} s (as long as "
            "bench's own took)"
            if startup_s is not None and self.process_starts
            else ""
        )
        total = self.estimate_s(step_s, startup_s or 0.0)
        shared = (
            f", {self.shared_steps} of them at {self.slowdown:g}× (their ranks split the cores)"
            if self.shared_steps and self.slowdown != 1
            else ""
        )
        left_out = (
            "; torch.compile's compilation is not counted (tens of seconds on a CPU)"
            if self.compiles
            else ""
        )
        return (
            f"bench: a step takes {step_s:.3g} s, so bench should take about "
            f"{duration_text(total)} in all ({duration_text(self.timed_s)} of timed rates + "
            f"{self.steps} steps × {step_s:.3g} s{shared}{starts}{left_out})"
        )


def plan_duration(
    options: DictConfig,
    worker_counts: int,
    variants: int,
    run_ranks: Sequence[int],
    side_by_side_ranks: Sequence[int],
    slowdown: float = 1.0,
    compiles: bool = False,
) -> DurationPlan:
    """The plan of a bench with the config ``options`` (``cfg.bench``) and what it derived.

    ``worker_counts``: the DataLoader worker counts measured; ``variants``: the
    performance options measured besides the config as given; ``run_ranks``: the ranks
    of each ``train.py`` run; ``side_by_side_ranks``: the processes of each CPU
    side-by-side run (none, or 1 and N); ``slowdown``: on CPUs, a step of those runs
    against the one-device step (the one device's threads over a rank's); ``compiles``:
    a ``compile`` option is among the variants.
    """
    warmup, window = int(options.warmup_steps), int(options.window_steps)
    windows = int(options.windows)
    scaling_runs, side_by_side = len(run_ranks), len(side_by_side_ranks)
    step_runs = [("one-device step, bare loop and Lightning", 2 * windows, warmup + window)]
    if variants:
        step_runs.append(("performance options", variants + 1, warmup + int(options.option_steps)))
    if side_by_side:
        step_runs.append(("side-by-side runs", side_by_side, warmup + window))
    train_steps = warmup + window * windows
    return DurationPlan(
        seconds=float(options.seconds),
        timed_rates=ONE_CORE_RATES + worker_counts + 2 * ROUNDS,
        step_runs=tuple(step_runs),
        overhead_steps=int(options.overhead_rounds)
        * 2
        * (OVERHEAD_WARMUP + int(options.overhead_steps)),
        train_runs=scaling_runs,
        train_steps=train_steps,
        timeout_s=float(options.timeout_s),
        process_starts=sum(run_ranks) + sum(side_by_side_ranks),
        shared_steps=side_by_side * (warmup + window) + scaling_runs * train_steps,
        slowdown=slowdown,
        compiles=compiles,
    )


def duration_text(seconds: float) -> str:
    """``seconds`` as a reader counts them: 45 s, 3.2 min, 1.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
