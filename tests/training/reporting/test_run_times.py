import time

import pytest
from lightning.pytorch.callbacks import Timer

from segscale.training.reporting import run_times
from segscale.training.reporting.run_times import (
    PROCESS_START,
    TRAIN_CALL,
    RunClock,
    RunTimes,
    process_age,
    warmup_steps,
)


def test_the_process_age_comes_from_the_operating_system():
    age = process_age()
    assert age is not None and 0 < age < 24 * 3600


def test_only_the_first_clock_of_a_process_counts_from_its_start(monkeypatch):
    monkeypatch.setattr(RunClock, "_process_start_counted", False)
    monkeypatch.setattr(run_times, "_imports_done", None)
    first, second = RunClock(), RunClock()
    assert first.since == PROCESS_START and list(first.phases) == ["python, imports, config"]
    assert second.since == TRAIN_CALL and second.phases == {}


def test_the_end_of_the_imports_splits_the_first_phase(monkeypatch):
    monkeypatch.setattr(RunClock, "_process_start_counted", False)
    monkeypatch.setattr(run_times, "_imports_done", None)
    run_times.imports_done()
    marked = run_times._imports_done
    time.sleep(0.05)
    run_times.imports_done()  # only the first call counts
    assert run_times._imports_done == marked
    clock = RunClock()
    assert list(clock.phases) == ["python, imports", "config, run folder"]
    assert clock.phases["config, run folder"] >= 0.05
    assert sum(clock.phases.values()) == pytest.approx(clock.elapsed(), abs=0.01)


def test_the_warm_up_is_a_tenth_of_the_steps_and_at_least_one():
    assert [warmup_steps(n) for n in (1, 9, 10, 11, 200)] == [1, 1, 1, 2, 20]


def test_the_steady_rate_leaves_out_the_slow_first_step_and_validation():
    timer = Timer()
    times = RunTimes(timer)
    timer.on_train_start(None, None)  # Lightning's Timer times the training stage
    times.batch_start()
    time.sleep(0.3)  # a first step that compiles, searches kernels, starts workers
    times.step_end(1, 8)
    for step in range(2, 22):
        times.batch_start()
        time.sleep(0.01)
        if step == 10:  # a validation between two steps
            times.step_end(step, 8 * step)
            times.validation_start()
            time.sleep(0.3)
            continue
        times.step_end(step, 8 * step)
    times.batch_start()
    timer.on_train_end(None, None)
    split = times.split()
    steady, overall = split["steady_patches_per_s"], 8 * 21 / split["time_split_s"]["training"]
    assert steady == pytest.approx(8 / 0.01, rel=0.5)  # sleep overshoots on a busy machine
    assert steady > 2 * overall
    assert split["time_split_s"]["validation"] == pytest.approx(0.3, abs=0.1)
    assert split["steady_after_steps"] == 3
    phases = split["startup_phases_s"]
    assert phases["first step"] == pytest.approx(0.3, abs=0.1)
    assert sum(phases.values()) == pytest.approx(split["time_to_first_step_s"], abs=0.01)


def test_a_launch_of_few_steps_has_no_steady_rate():
    times = RunTimes(Timer())
    for step in range(1, 4):
        times.batch_start()
        times.step_end(step, 4 * step)
    assert times.split()["steady_patches_per_s"] is None


def test_accumulated_batches_count_at_their_optimizer_step():
    times = RunTimes(Timer())
    for batch, steps in enumerate((0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6)):
        times.batch_start()
        times.step_end(steps, 4 * (batch + 1))
    assert list(times._step_patches) == [8, 16, 24, 32, 40, 48]
