"""The step model's inputs: DDP's buckets, and the values each description refuses."""

from __future__ import annotations

import pytest

from segscale.bench.predict.step_profile import BatchNormSync, Gradients, Host, StepProfile


def test_uniform_gradients_form_ddp_buckets():
    # 1 MiB first bucket, then 25 MiB; a bucket closes with the gradient that reaches it.
    mib = 2**20
    g = Gradients.uniform([0.5 * mib, 0.75 * mib, 10 * mib, 20 * mib, 1 * mib])
    assert g.buckets == (1.25 * mib, 30 * mib, 1 * mib)
    assert g.ready == pytest.approx((1.25 / 32.25, 31.25 / 32.25, 1.0))
    assert g.total_bytes == 32.25 * mib


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: StepProfile(0.0, 1.0, 0.0, 1), "forward_s"),
        (lambda: StepProfile(1.0, -1.0, 0.0, 1), "backward_s"),
        (lambda: StepProfile(1.0, 1.0, -0.1, 1), "optimizer_s"),
        (lambda: StepProfile(1.0, 1.0, 0.0, 0), "batch"),
        (lambda: StepProfile(1.0, 1.0, 0.0, 1, jitter=-0.1), "jitter"),
        (lambda: StepProfile(1.0, 1.0, 0.0, 1, overhead_s=-1.0), "overhead_s"),
        (lambda: Gradients((), ()), "buckets"),
        (lambda: Gradients((1.0,), (1.5,)), "ready"),
        (lambda: BatchNormSync(-1, 8.0), "layers"),
        (lambda: BatchNormSync(1, 0.0), "message_bytes"),
        (lambda: Host(slowdown=0.5), "slowdown"),
        (lambda: Host(skew_s=-1.0), "skew_s"),
    ],
)
def test_invalid_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=rf"^{argument}\w* must"):
        call()
