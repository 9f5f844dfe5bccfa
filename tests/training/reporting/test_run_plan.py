from datetime import datetime, timezone

from segscale.training.reporting.run_plan import RunPlan, estimate_line, remaining_s

PLAN = RunPlan(
    epochs=10,
    steps_per_epoch=100,
    total_steps=1000,
    patches_per_epoch=800,
    validation_passes=10,
    validation_batches=25,
)


def test_the_time_left_counts_the_steps_and_validations_left():
    # 900 steps at 2 s and 9 passes at 30 s.
    assert remaining_s(PLAN, 100, 2.0, 1, 30.0) == 900 * 2.0 + 9 * 30.0
    assert remaining_s(PLAN, 1000, 2.0, 10, 30.0) == 0


def test_the_lines_say_the_plan_and_the_end():
    assert PLAN.line() == (
        "plan: 10 epochs of 100 steps = 1000 steps, 800 patches per epoch; "
        "10 validation passes of 25 batches"
    )
    now = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    line = estimate_line(2.5, 26 * 3600 + 60, 26 * 3600 + 120, True, now)
    assert line == (
        "estimate: 2.500 s per step; 26h01m00s left of about 26h02m00s in all, "
        "ending around 2026-01-02 14:01+00:00"
    )
