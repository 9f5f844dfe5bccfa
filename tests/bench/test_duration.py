import pytest
from omegaconf import OmegaConf

from segscale.bench.duration import duration_text, plan_duration
from segscale.bench.measure.storage import ROUNDS

BENCH = {
    "seconds": 2.0,
    "warmup_steps": 5,
    "window_steps": 10,
    "windows": 3,
    "option_steps": 10,
    "overhead_steps": 300,
    "overhead_rounds": 5,
    "timeout_s": 1800,
}


def options(**changed):
    return OmegaConf.create(BENCH | changed)


def test_the_plan_counts_what_the_config_asks_for():
    plan = plan_duration(options(), 2, variants=4, run_ranks=(1, 2, 2), side_by_side_ranks=(1, 2))
    assert plan.timed_rates == 3 + 2 + 2 * ROUNDS  # one core's 3, 2 worker counts, storage
    assert plan.timed_s == plan.timed_rates * 2.0
    # one-device step: 3 rounds of bare + Lightning, 15 steps each; 5 options (as
    # configured and 4) of 15; 2 side-by-side runs of 15; 3 train.py runs of 5 + 30
    assert plan.steps == 6 * 15 + 5 * 15 + 2 * 15 + 3 * 35
    assert plan.process_starts == (1 + 2 + 2) + (1 + 2)  # every rank a fresh interpreter
    assert plan.estimate_s(0.5, 10.0) == pytest.approx(plan.timed_s + plan.steps * 0.5 + 80.0)
    assert plan.longest_s() == plan.timed_s + 3 * 1800
    text = plan.describe()
    assert text.startswith(
        f"bench will take {duration_text(plan.timed_s)} of timed rates plus 300 "
    )
    assert "the train.py runs take at most 1.5 h" in text
    assert "3 train.py run(s) × 35 steps, each stopped after bench.timeout_s=1800 s" in text


@pytest.mark.parametrize(
    ("changed", "field"),
    [
        ({"seconds": 5.0}, "timed_s"),
        ({"window_steps": 20}, "steps"),
        ({"warmup_steps": 1}, "steps"),
        ({"windows": 1}, "steps"),
        ({"option_steps": 2}, "steps"),
        ({"timeout_s": 60}, "longest"),
    ],
)
def test_the_estimate_follows_the_config(changed, field):
    def plan(**values):
        return plan_duration(options(**values), 2, 4, (1, 2, 2), (1, 2))

    before, after = plan(), plan(**changed)
    assert before.describe() != after.describe()
    if field == "longest":
        assert after.longest_s() < before.longest_s()
    else:
        assert getattr(after, field) != getattr(before, field)


def test_the_rest_is_estimated_at_the_measured_step():
    plan = plan_duration(options(), 1, 0, (1,), ())
    assert plan.steps == 6 * 15 + 35
    assert "about 70 s in all" in plan.describe_rest(0.4, None)  # 20 s + 125 × 0.4 s
    # one train.py run's start-up, as long as bench's own: 20 s more
    assert plan.process_starts == 1
    text = plan.describe_rest(0.4, 20.0)
    assert "about 1.5 min in all" in text and "1 process start(s) × 20 s" in text
    assert [duration_text(s) for s in (45, 192, 7200)] == ["45 s", "3.2 min", "2.0 h"]


def test_runs_whose_ranks_split_the_cores_are_estimated_at_their_slower_step():
    # A 2-core CPU: the one device computes with 2 threads, each rank of the train.py
    # and side-by-side runs with 1, so their steps take about twice as long.
    plan = plan_duration(options(), 1, 1, (1, 2, 2), (1, 2), slowdown=2.0, compiles=True)
    shared = 2 * 15 + 3 * 35
    assert plan.shared_steps == shared
    even = plan_duration(options(), 1, 1, (1, 2, 2), (1, 2))
    assert plan.estimate_s(0.3, 9.0) == pytest.approx(even.estimate_s(0.3, 9.0) + shared * 0.3)
    text = plan.describe_rest(0.3, 9.0)
    assert f"{shared} of them at 2× (their ranks split the cores)" in text
    assert "8 process start(s) × 9 s" in text
    assert "torch.compile's compilation is not counted" in text
    assert "compilation" not in even.describe_rest(0.3, 9.0)
    assert "split the cores" not in even.describe_rest(0.3, 9.0)
