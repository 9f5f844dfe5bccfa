import pytest

from segscale.bench.measure.pipeline import calls_per_second, measure_pipeline, worker_counts


@pytest.mark.parametrize(
    ("cpus", "configured", "counts"),
    [(2, 1, [1, 2]), (16, 7, [1, 2, 4, 7, 8, 16]), (1, 1, [1]), (6, 0, [1, 2, 4, 6])],
)
def test_worker_counts(cpus, configured, counts):
    assert worker_counts(cpus, configured) == counts


def test_calls_per_second_counts_calls_after_warmup():
    calls = []
    rate = calls_per_second(calls.append, seconds=0.01, warmup=3)
    assert calls[:4] == [0, 1, 2, 3]
    assert rate > 0 and len(calls) >= 3 + 5


def test_pipeline_rates_of_the_tiny_config(make_config):
    from segscale.runs.builders import build_datamodule
    from segscale.runs.scaling.rules import ScalingRules

    cfg = make_config()
    datamodule = build_datamodule(cfg, ScalingRules().resolve(4, 0.01, 1))
    datamodule.check()
    done = []
    rates = measure_pipeline(datamodule, [0, 1], seconds=0.05, progress=done.append)
    assert done == ["pipeline: one core", "pipeline: 0 workers", "pipeline: 1 workers"]
    assert set(rates.loader) == {0, 1} and all(r > 0 for r in rates.loader.values())
    # The crop alone is the cheapest; augmentation costs at least the warp
    assert rates.crop_only > rates.crop_and_warp > 0
    assert rates.augmentation_cost > 0.5
    assert rates.as_dict()["loader"].keys() == {"0", "1"}
