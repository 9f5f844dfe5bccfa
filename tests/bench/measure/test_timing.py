import pytest

from segscale.bench.measure.timing import summarize_steps


def test_summarize_steps_drops_warmup_and_splits_windows():
    timing = summarize_steps([9.0, 9.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0], warmup=2, windows=3)
    assert timing.steps == 6
    assert timing.mean_s == pytest.approx(2.0)
    assert timing.window_means_s == (1.0, 2.0, 3.0)
    assert timing.spread_s == pytest.approx(1.0)
    # population std of [1,1,2,2,3,3] is sqrt(2/3); over a mean of 2
    assert timing.jitter == pytest.approx((2 / 3) ** 0.5 / 2)


def test_one_window_has_no_spread():
    assert summarize_steps([1.0, 2.0, 2.0], warmup=1, windows=1).spread_s == 0.0


def test_too_few_steps_are_refused():
    with pytest.raises(ValueError, match="at least one per window"):
        summarize_steps([1.0, 1.0], warmup=2, windows=1)
