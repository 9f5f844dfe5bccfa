"""The DDP prediction model: its arithmetic by hand, then against published 8-GPU scaling.

Validation (``PUBLISHED``): each case gives the model a published single-GPU throughput and
ResNet-50's gradient size, and compares the predicted 8-GPU efficiency with the published one.
Assumptions, the same for every case (none tuned per case):

- one GPU's step is batch / throughput, split optimizer 3 %, and forward : backward = 1 : 2
  of the rest (backward costs about twice the forward: two matmuls per layer instead of one);
- ResNet-50 v1.5 has 25,557,032 parameters; DDP all-reduces them as fp32 (102.2 MB) under
  FP32, TF32 and AMP alike, since AMP keeps fp32 parameters and so fp32 gradients;
- the step time varies from step to step with a coefficient of variation of 2 % (``JITTER``);
  at 8 GPUs that costs 1.4236 × 2 % ≈ 2.8 % of a step, waiting for the slowest rank;
- a prediction is right when it is within ``TOLERANCE`` (5 percentage points) of the published
  efficiency. A known miss (``KNOWN_MISSES``) is asserted with its sign and size instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from segscale.bench.interconnects import INTERCONNECTS, Interconnect, find_interconnect
from segscale.bench.prediction import (
    DDP_BUCKET_BYTES,
    StepProfile,
    bucket_sizes,
    efficiency,
    expected_max_standard_normal,
    exposed_communication,
    predict,
    ring_allreduce_time,
    speedup,
    straggler_wait,
)


@dataclass(frozen=True)
class PublishedScaling:
    """One published 1-GPU vs 8-GPU data-parallel training result."""

    case: str
    source: str
    interconnect: str
    batch: int  # per GPU
    throughput_1: float  # img/s on one GPU
    speedup_8: float  # 8-GPU throughput / 1-GPU throughput

    @property
    def efficiency_8(self) -> float:
        return self.speedup_8 / 8


_DLE = (
    "NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
    "'Training performance results' (pytorch-21.03 NGC container)"
)
# Per-GPU batch sizes of those runs: PyTorch/Classification/ConvNets/configs.yml, models.resnet50:
# DGX1V FP32 batch_size 112; DGXA100 TF32 and AMP batch_size 256.
PUBLISHED: tuple[PublishedScaling, ...] = (
    PublishedScaling("DGX-1 V100 16GB FP32", _DLE, "NVLink V100", 112, 367.0, 7.76),
    PublishedScaling("DGX A100 80GB TF32", _DLE, "NVLink A100", 256, 938.0, 7.72),
    PublishedScaling("DGX A100 80GB AMP", _DLE, "NVLink A100", 256, 2470.0, 6.72),
    # pytorch/pytorch benchmarks/distributed/ddp/README.md, resnet50 batch 32, p50: 329 img/s
    # "1 GPUs -- no ddp", 307 img/s per GPU "8 GPUs -- 1M/8G"; run on DGX-1-class V100 boxes
    # (its nvidia-smi topo shows the NV1/NV2 hybrid cube mesh).
    PublishedScaling(
        "PyTorch DDP benchmark V100",
        "pytorch/pytorch benchmarks/distributed/ddp/README.md",
        "NVLink V100",
        32,
        329.0,
        8 * 307 / 329,
    ),
)

RESNET50_GRAD_BYTES = 25_557_032 * 4
OPTIMIZER_SHARE = 0.03
JITTER = 0.02
TOLERANCE = 0.05

# The model is optimistic by this much (predicted minus published efficiency, as fractions).
# DGX A100 AMP: 2470 img/s per GPU means the node decodes and augments ~19,800 JPEG/s on its
# CPUs, and a step is only ~0.1 s, so fixed per-step costs (kernel launches, DDP's bucket copies,
# the data loader's hand-off) weigh ~2.6× more than under TF32; the model sees neither the input
# pipeline (no data rate is given) nor those overheads, and predicts ~97 % against 84 %.
KNOWN_MISSES: dict[str, tuple[float, float]] = {"DGX A100 80GB AMP": (0.05, 0.15)}

LINK = Interconnect("hand", bus_bandwidth=1e9, latency=0.0, source="round numbers")


def _resnet50_profile(row: PublishedScaling, jitter: float) -> StepProfile:
    step = row.batch / row.throughput_1
    optimizer = OPTIMIZER_SHARE * step
    forward = (step - optimizer) / 3
    return StepProfile(forward, 2 * forward, optimizer, row.batch, jitter)


def _predicted_efficiency(row: PublishedScaling, jitter: float) -> float:
    link = find_interconnect(row.interconnect)
    return predict(_resnet50_profile(row, jitter), RESNET50_GRAD_BYTES, 8, link).efficiency


# --- arithmetic by hand ---------------------------------------------------------------------


def test_ring_allreduce_closed_form():
    link = Interconnect("x", bus_bandwidth=1e9, latency=1e-5, source="")
    assert ring_allreduce_time(1e9, 1, link) == 0.0
    # 2(n-1)/n · 1 GB / 1 GB/s + 2(n-1) · 10 µs
    assert ring_allreduce_time(1e9, 2, link) == pytest.approx(1.0 + 2e-5)
    assert ring_allreduce_time(1e9, 4, link) == pytest.approx(1.5 + 6e-5)
    assert ring_allreduce_time(1e9, 8, link) == pytest.approx(1.75 + 14e-5)


def test_bucket_sizes():
    assert bucket_sizes(250.0, 100.0) == [100.0, 100.0, 50.0]
    assert bucket_sizes(300.0, 100.0) == [100.0, 100.0, 100.0]
    assert bucket_sizes(30.0, 100.0) == [30.0]
    sizes = bucket_sizes(RESNET50_GRAD_BYTES)
    assert len(sizes) == 4
    assert sum(sizes) == pytest.approx(RESNET50_GRAD_BYTES)
    assert sizes[:3] == [DDP_BUCKET_BYTES] * 3
    assert sizes[-1] == pytest.approx(RESNET50_GRAD_BYTES - 3 * DDP_BUCKET_BYTES)


def _profile(backward: float, forward: float = 1.0) -> StepProfile:
    return StepProfile(forward_s=forward, backward_s=backward, optimizer_s=0.0, batch=1)


def test_exposed_communication_by_hand():
    # 4 buckets of 1e8 bytes over 2 devices at 1 GB/s: 0.1 s each, 0.4 s in all.
    def exposed(backward: float) -> float:
        return exposed_communication(_profile(backward), 4e8, 2, LINK, bucket_bytes=1e8)

    # Ready at 1, 2, 3, 4 s: each bucket is done before the next is ready; only the last shows.
    assert exposed(4.0) == pytest.approx(0.1)
    # Ready every 0.1 s: communication keeps pace, still only the last bucket.
    assert exposed(0.4) == pytest.approx(0.1)
    # Ready every 0.05 s: the stream falls behind; the first starts at 0.05 and the rest queue:
    # end = 0.05 + 0.4, exposed = end - backward.
    assert exposed(0.2) == pytest.approx(0.05 + 0.4 - 0.2)
    # A tiny backward: total communication minus backward (plus the first bucket's ready time).
    assert exposed(0.004) == pytest.approx(0.001 + 0.4 - 0.004)
    assert exposed(4.0) <= exposed(0.2) <= exposed(0.004)
    assert exposed_communication(_profile(0.004), 4e8, 1, LINK, bucket_bytes=1e8) == 0.0


def test_expected_max_standard_normal():
    assert expected_max_standard_normal(1) == 0.0
    for n, known in ((2, 0.5642), (4, 1.0294), (8, 1.4236)):
        assert expected_max_standard_normal(n) == pytest.approx(known, abs=1e-3)


def test_straggler_wait():
    profile = StepProfile(0.3, 0.6, 0.1, batch=10, jitter=0.1)
    assert straggler_wait(profile, 1) == 0.0
    assert straggler_wait(profile, 2) == pytest.approx(0.1 * 1.0 * 0.5642, abs=1e-4)
    assert straggler_wait(StepProfile(0.3, 0.6, 0.1, batch=10), 8) == 0.0


def test_predict_by_hand():
    # Step 1 s, 10 samples. Buckets of 1e8 bytes ready at 0.15, 0.3, 0.45, 0.6 s, 0.1 s each:
    # the last ends at 0.7 s, 0.1 s past backward. Step on 2 devices: 1.1 s.
    profile = StepProfile(0.3, 0.6, 0.1, batch=10)
    p = predict(profile, 4e8, 2, LINK, bucket_bytes=1e8)
    assert p.exposed_communication_s == pytest.approx(0.1)
    assert p.straggler_s == 0.0
    assert p.step_s == pytest.approx(1.1)
    assert p.throughput == pytest.approx(20 / 1.1)
    assert p.speedup == pytest.approx(2 / 1.1)
    assert p.efficiency == pytest.approx(1 / 1.1)
    assert not p.data_bound
    assert p.as_dict()["interconnect"] == "hand"
    assert set(p.as_dict()) == {
        "devices",
        "interconnect",
        "step_s",
        "exposed_communication_s",
        "straggler_s",
        "throughput",
        "speedup",
        "efficiency",
        "data_bound",
    }

    jittery = StepProfile(0.3, 0.6, 0.1, batch=10, jitter=0.1)
    p = predict(jittery, 4e8, 2, LINK, bucket_bytes=1e8)
    assert p.step_s == pytest.approx(1.1 + 0.1 * 0.5642, abs=1e-4)

    single = predict(profile, 4e8, 1, LINK, bucket_bytes=1e8)
    assert single.step_s == pytest.approx(1.0)
    assert (single.speedup, single.efficiency) == (1.0, 1.0)


def test_predict_data_cap():
    profile = StepProfile(0.3, 0.6, 0.1, batch=10)
    # Compute alone would give 18.2 samples/s on 2 devices; the pipeline gives 2 × 5.
    capped = predict(profile, 4e8, 2, LINK, bucket_bytes=1e8, data_rate_per_device=5.0)
    assert capped.data_bound
    assert capped.throughput == pytest.approx(10.0)
    # One device is capped at 5 too, so the speed-up is a perfect 2.
    assert capped.speedup == pytest.approx(2.0)
    assert capped.efficiency == pytest.approx(1.0)
    # 2 × 9.5 = 19 > 18.2: compute and communication set the rate; one device is capped at 9.5.
    loose = predict(profile, 4e8, 2, LINK, bucket_bytes=1e8, data_rate_per_device=9.5)
    assert not loose.data_bound
    assert loose.throughput == pytest.approx(20 / 1.1)
    assert loose.speedup == pytest.approx(20 / 1.1 / 9.5)


def test_speedup_and_efficiency():
    assert speedup(700.0, 100.0) == pytest.approx(7.0)
    assert efficiency(7.0, 8) == pytest.approx(0.875)
    assert efficiency(1.0, 1) == 1.0


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: ring_allreduce_time(1e6, 0, LINK), "n"),
        (lambda: ring_allreduce_time(-1.0, 2, LINK), "nbytes"),
        (lambda: bucket_sizes(0.0), "grad_bytes"),
        (lambda: bucket_sizes(1e6, 0.0), "bucket_bytes"),
        (lambda: StepProfile(0.0, 1.0, 0.0, 1), "forward_s"),
        (lambda: StepProfile(1.0, -1.0, 0.0, 1), "backward_s"),
        (lambda: StepProfile(1.0, 1.0, -0.1, 1), "optimizer_s"),
        (lambda: StepProfile(1.0, 1.0, 0.0, 0), "batch"),
        (lambda: StepProfile(1.0, 1.0, 0.0, 1, jitter=-0.1), "jitter"),
        (lambda: expected_max_standard_normal(0), "n"),
        (lambda: straggler_wait(_profile(1.0), 1.5), "n"),
        (lambda: predict(_profile(1.0), 1e6, 2, LINK, data_rate_per_device=0.0), "data_rate"),
        (lambda: speedup(0.0, 1.0), "throughput_n"),
        (lambda: efficiency(2.0, 0), "n"),
        (lambda: Interconnect("x", 0.0, 0.0, ""), "bus_bandwidth"),
        (lambda: Interconnect("x", 1e9, -1.0, ""), "latency"),
    ],
)
def test_invalid_input_names_the_argument(call, argument):
    with pytest.raises(ValueError, match=rf"^{argument}\w* must be"):
        call()


def test_interconnect_table():
    assert [link.name for link in INTERCONNECTS] == [
        "PCIe 3.0 x16",
        "PCIe 4.0 x16",
        "PCIe 5.0 x16",
        "NVLink V100",
        "NVLink A100",
        "NVLink H100",
        "InfiniBand HDR",
        "InfiniBand NDR",
    ]
    assert find_interconnect("nvlink a100") is INTERCONNECTS[4]
    with pytest.raises(ValueError, match=r"'NVLink V100'.*'InfiniBand NDR'"):
        find_interconnect("Ethernet 10G")


# --- validation against published numbers ---------------------------------------------------


@pytest.mark.parametrize("row", PUBLISHED, ids=lambda row: row.case)
def test_communication_alone_predicts_near_perfect_scaling(row):
    # A 102 MB all-reduce over NVLink takes ~1.4 ms (V100) against a backward of 60-200 ms:
    # all but the last bucket hide, so without stragglers the model says ~99.9 %.
    assert _predicted_efficiency(row, jitter=0.0) > 0.99


@pytest.mark.parametrize("row", PUBLISHED, ids=lambda row: row.case)
def test_predicted_8_gpu_efficiency_against_published(row):
    miss = _predicted_efficiency(row, JITTER) - row.efficiency_8
    if row.case in KNOWN_MISSES:
        low, high = KNOWN_MISSES[row.case]
        assert low < miss < high
    else:
        # Predicted vs published: V100 FP32 97.1 % vs 97.0 %; A100 TF32 97.2 % vs 96.5 %;
        # PyTorch DDP benchmark 96.9 % vs 93.3 %, of which ~3 points DDP costs on one GPU
        # already (329 -> 319 img/s with DDP on 1 GPU in that README), which the model omits.
        assert abs(miss) <= TOLERANCE
