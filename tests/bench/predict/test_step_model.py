"""The step model's terms with fixed inputs, by hand (published rows: test_published_scaling)."""

from __future__ import annotations

import pytest

from segscale.bench.predict.step_model import efficiency, predict, speedup
from segscale.bench.predict.step_profile import BatchNormSync, Collectives, Host, StepProfile
from tests.bench.predict.test_collective_timing import LINK, _gradients


def _profile(backward: float, forward: float = 1.0, jitter: float = 0.0) -> StepProfile:
    return StepProfile(
        forward_s=forward, backward_s=backward, optimizer_s=0.0, batch=1, jitter=jitter
    )


def test_predict_by_hand():
    # Step 1 s (0.3 + 0.6 + 0.1), 10 samples; 4 buckets of 1e8 bytes, the last ends 0.1 s
    # past backward. 2 ranks: 1.1 s, plus the loss normaliser's 16 bytes (16 ns).
    profile = StepProfile(0.3, 0.6, 0.1, batch=10)
    p = predict(profile, _gradients(4, 1e8), 2, LINK, collectives=Collectives((16.0,)))
    assert p.exposed_communication_s == pytest.approx(0.1)
    assert p.collectives_s == pytest.approx(16e-9)
    assert p.step_s == pytest.approx(1.1, abs=1e-6)
    assert p.throughput == pytest.approx(20 / 1.1, rel=1e-5)
    assert p.speedup == pytest.approx(2 / 1.1, rel=1e-5)
    assert p.efficiency == pytest.approx(1 / 1.1, rel=1e-5)
    assert not p.data_bound
    single = predict(profile, _gradients(4, 1e8), 1, LINK)
    assert single.step_s == pytest.approx(1.0)
    assert (single.speedup, single.efficiency) == (1.0, 1.0)


def test_predict_with_every_term():
    # Overhead 2 ms, slowdown 1.25, 10 batch-norm layers (1 + 1 collectives, 1 host sync,
    # 5 ms extra arithmetic), skew 1 ms collectives / 2 ms host syncs, jitter 10 %.
    profile = StepProfile(0.2, 0.4, 0.0, batch=4, jitter=0.1, overhead_s=0.002)
    host = Host(slowdown=1.25, overlap=False, skew_s=1e-3, host_sync_skew_s=2e-3)
    bn = BatchNormSync(10, 100.0, 1, 1, 1, compute_s=0.005)
    gradients = _gradients(1, 1e6)  # 1 ms on LINK
    p = predict(profile, gradients, 2, LINK, host, bn, Collectives((8.0,)))
    e = 0.5642
    collective = 100e-9 + e * 1e-3
    assert p.compute_s == pytest.approx(0.75)
    sync = 0.005 * 1.25 + 10 * e * 2e-3 + 20 * collective
    assert p.sync_batchnorm_s == pytest.approx(sync, rel=1e-3)
    assert p.collectives_s == pytest.approx(8e-9 + e * 1e-3, rel=1e-3)
    assert p.exposed_communication_s == pytest.approx(1e-3)
    assert p.straggler_s == pytest.approx(0.1 * (0.75 + 0.005 * 1.25) * e, rel=1e-3)
    total = 0.75 + 0.002 + sync + p.collectives_s + 1e-3 + p.straggler_s
    assert p.step_s == pytest.approx(total)
    assert p.speedup == pytest.approx(8 / total / (4 / 0.602))


def test_predict_data_caps():
    profile = StepProfile(0.3, 0.6, 0.1, batch=10)
    # Compute alone: 18.2 samples/s on 2 ranks; each rank's workers give 5: data-bound.
    capped = predict(profile, _gradients(4, 1e8), 2, LINK, data_rate_1=5.0, data_rate_n=5.0)
    assert capped.data_bound
    assert capped.throughput == pytest.approx(10.0)
    assert capped.speedup == pytest.approx(2.0)
    # Fewer workers per rank at 2 ranks than at 1: 9.5 alone, 4 each with 2 ranks.
    shared = predict(profile, _gradients(4, 1e8), 2, LINK, data_rate_1=9.5, data_rate_n=4.0)
    assert shared.throughput == pytest.approx(8.0)
    assert shared.speedup == pytest.approx(8.0 / 9.5)


def test_speedup_and_efficiency():
    assert speedup(700.0, 100.0) == pytest.approx(7.0)
    assert efficiency(7.0, 8) == pytest.approx(0.875)
    assert efficiency(1.0, 1) == 1.0


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (
            lambda: predict(_profile(1.0), _gradients(1, 1.0), 2, LINK, data_rate_n=0.0),
            "data_rate_n",
        ),
        (lambda: speedup(0.0, 1.0), "throughput_n"),
        (lambda: efficiency(2.0, 0), "n"),
    ],
)
def test_invalid_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=rf"^{argument}\w* must"):
        call()
