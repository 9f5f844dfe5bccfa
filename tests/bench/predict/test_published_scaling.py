"""The step model against published multi-GPU training, segmentation with SyncBN first.

Each row gives the model a published one-GPU step time (seconds per iteration, read from
the run's own log where the source has one: several READMEs disagree with their logs)
and predicts the efficiency on N GPUs, t1 / tN for a fixed per-GPU batch. One set of
assumptions for every row, none tuned per row:

- one GPU's step splits optimizer 3 %, forward : backward = 1 : 2 of the rest;
- the step time varies by 2 % from step to step (``JITTER``);
- DDP's buckets are formed from the parameter bytes, gradients appearing at a uniform rate;
- the network's batch-norm layers are counted from a network of the same architecture
  built here (``segmentation_models_pytorch`` / ``timm``), adjusted where the published
  network differs (noted per row), with the collectives and host syncs per layer of the
  implementation the run used (``SYNC_BATCHNORM_COLLECTIVES``);
- the ranks' arrival spread at a collective and at a host sync
  (``segscale.bench.predict.arrival_spread``), each fitted to one row (``CALIBRATION``), in the
  model that fits the rows better (``GPU_SPREAD``); the others are predictions;
- all-reduce times from the interconnect curves (``segscale.bench.predict.interconnects``).

A row is right within ``TOLERANCE`` (5 percentage points). A row the model misses
(``KNOWN_MISSES``) is asserted with its miss's sign and size and explained beside it.

A row validates the model only if it could fail: if halving its one-GPU step, doubling
its all-reduce times or doubling the arrival spreads moves its prediction by more than
``TOLERANCE``. A row that none of them moves so far (``CONSISTENCY_CHECKS``: no
synchronized batch norm, gradients hidden behind the backward pass) is predicted near
97 % whatever its inputs; it checks that the model adds nothing where nothing is paid,
and is not counted as a validation. Each term of the step model, dropped or doubled,
fails at least one of these assertions, except the terms no published row can see
(``UNSEEN_TERMS``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from segscale.bench.predict import step_model
from segscale.bench.predict.arrival_spread import (
    ALTERNATIVE,
    CONSTANT,
    GPU_SPREAD,
    PER_SEGMENT,
    ArrivalSpread,
)
from segscale.bench.predict.interconnects import Interconnect, find_interconnect
from segscale.bench.predict.step_model import STEP_TERMS
from segscale.bench.predict.step_profile import (
    SYNC_BATCHNORM_COLLECTIVES,
    BatchNormSync,
    Gradients,
    StepProfile,
)

JITTER = 0.02
OPTIMIZER_SHARE = 0.03
TOLERANCE = 0.05
STATISTICS_BYTES = 2048.0  # one layer's per-channel statistics: (2C + 1) floats, C ~ 256


@dataclass(frozen=True)
class Row:
    """One published 1-GPU vs N-GPU data-parallel run at a fixed per-GPU batch."""

    case: str
    source: str
    link: str
    devices: int
    batch: int
    t1: float  # seconds per iteration on one GPU
    tn: float  # seconds per iteration on N GPUs
    parameters: float
    batchnorm_layers: int = 0
    sync_batchnorm: str | None = None  # an implementation of SYNC_BATCHNORM_COLLECTIVES

    @property
    def efficiency(self) -> float:
        return self.t1 / self.tn


_PT_DLV3 = "PaddlePaddle/Perf DeepLabV3P/OtherReports/PyTorch/logs/pytorch (mmseg, NGC 20.06)"
_PD_DLV3 = "PaddlePaddle/Perf DeepLabV3P/logs/paddle (PaddleSeg, 2021-05)"
_PT_HR = "PaddlePaddle/Perf HRNetW18/OtherReports/PyTorch/logs (mmseg)"
_PD_HR = "PaddlePaddle/Perf HRNetW18/logs/paddle (PaddleSeg, 2021-05)"
_NNUNET = "NVIDIA/DeepLearningExamples PyTorch/Segmentation/nnUNet/README.md (NGC 22.11)"
_DLE_RN50 = "NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md"
# DeepLabV3+ R50-D8 (mmseg): 62 batch-norm layers counted in smp's DeepLabV3+ ResNet-50,
# + 2 for ResNetV1c's three-convolution stem + 1 in the auxiliary FCN head = 65; about
# 43.6 M parameters (ASPP on 2048 channels; not stated in the source). PaddleSeg's
# ResNet50_vd DeepLabV3P: 26,794,243 parameters ("Total Params" in its log), same layers.
# FCN-HRNetV2-W18: 321 layers counted in timm's hrnet_w18 (features_only) + 1 in the FCN
# head = 322; 9,675,306 parameters (PaddleSeg's log).
ROWS: tuple[Row, ...] = (
    # log lines "time: 0.895 ... 0.901" (1 GPU, BN) and "1.021, 1.046, 1.038" (8, SyncBN)
    Row(
        "PyTorch DeepLabV3+ fp32",
        _PT_DLV3,
        "NVLink V100",
        8,
        4,
        0.900,
        1.035,
        43.6e6,
        65,
        "torch-1.6",
    ),
    # "0.483 ... 0.490" and "0.603, 0.637, 0.615"
    Row(
        "PyTorch DeepLabV3+ AMP",
        _PT_DLV3,
        "NVLink V100",
        8,
        4,
        0.487,
        0.618,
        43.6e6,
        65,
        "torch-1.6",
    ),
    # "0.554, 0.543, 0.543" and "1.052, 1.135, 1.112" (PyTorch 1.6, SyncBN)
    Row(
        "PyTorch HRNet-W18 fp32",
        _PT_HR,
        "NVLink V100",
        8,
        8,
        0.5467,
        1.100,
        9.68e6,
        322,
        "torch-1.6",
    ),
    # "0.540, 0.530, 0.528" and "1.046, 1.115, 1.156"
    Row(
        "PyTorch HRNet-W18 AMP",
        _PT_HR,
        "NVLink V100",
        8,
        8,
        0.5327,
        1.106,
        9.68e6,
        322,
        "torch-1.6",
    ),
    # Nov 2022 logs, PyTorch 1.11, norm_cfg BN on 8 GPUs too: "0.508, 0.506" and "0.552, 0.544"
    Row("PyTorch HRNet-W18 fp32, plain BN", _PT_HR, "NVLink V100", 8, 8, 0.507, 0.548, 9.68e6),
    # batch_cost "0.6322, 0.6338" and "0.6950, 0.6906" (SyncBatchNorm)
    Row(
        "Paddle DeepLabV3+ fp32", _PD_DLV3, "NVLink V100", 8, 4, 0.633, 0.6928, 26.8e6, 65, "paddle"
    ),
    # 4 nodes: "0.7223, 0.7225"; the network is not stated (V100 nodes of 2021: EDR assumed)
    Row(
        "Paddle DeepLabV3+ fp32, 32 GPUs",
        _PD_DLV3,
        "InfiniBand EDR",
        32,
        4,
        0.633,
        0.7224,
        26.8e6,
        65,
        "paddle",
    ),
    # "0.2351, 0.2358" and "0.3165, 0.3286"
    Row(
        "Paddle DeepLabV3+ AMP", _PD_DLV3, "NVLink V100", 8, 4, 0.2355, 0.3226, 26.8e6, 65, "paddle"
    ),
    # "0.3460, 0.3448"
    Row(
        "Paddle DeepLabV3+ AMP, 32 GPUs",
        _PD_DLV3,
        "InfiniBand EDR",
        32,
        4,
        0.2355,
        0.3454,
        26.8e6,
        65,
        "paddle",
    ),
    # "0.4425, 0.4394" and "0.5890, 0.6173, 0.6196, 0.6128" (10 iterations in all)
    Row("Paddle HRNet-W18 fp32", _PD_HR, "NVLink V100", 8, 8, 0.441, 0.6097, 9.68e6, 322, "paddle"),
    # "0.4583" and "0.6361, 0.6631"
    Row("Paddle HRNet-W18 AMP", _PD_HR, "NVLink V100", 8, 8, 0.4583, 0.6496, 9.68e6, 322, "paddle"),
    # "0.5941, 0.5936": faster on 32 GPUs than on 8 (0.6097)
    Row(
        "Paddle HRNet-W18 fp32, 32 GPUs",
        _PD_HR,
        "InfiniBand EDR",
        32,
        8,
        0.441,
        0.5939,
        9.68e6,
        322,
        "paddle",
    ),
    # nnU-Net 2D (instance norm: no batch-norm traffic), batch 64, img/s 1 GPU vs 8 GPUs;
    # parameters not stated (~30 M assumed: the all-reduce hides behind backward at any size)
    Row("nnU-Net 2D A100 AMP", _NNUNET, "NVLink A100", 8, 64, 64 / 1238.68, 64 * 8 / 9417.27, 30e6),
    Row("nnU-Net 2D A100 TF32", _NNUNET, "NVLink A100", 8, 64, 64 / 797.37, 64 * 8 / 6246.95, 30e6),
    Row("nnU-Net 2D V100 AMP", _NNUNET, "NVLink V100", 8, 64, 64 / 657.91, 64 * 8 / 4922.76, 30e6),
    Row("nnU-Net 2D V100 FP32", _NNUNET, "NVLink V100", 8, 64, 64 / 326.02, 64 * 8 / 2590.66, 30e6),
    # ResNet-50 v1.5 classification, 25,557,032 parameters, img/s 1 vs 8 GPUs
    Row(
        "ResNet-50 DGX-1 V100 FP32",
        _DLE_RN50,
        "NVLink V100",
        8,
        112,
        112 / 367.0,
        112 / 367.0 * 8 / 7.76,
        25_557_032,
    ),
    Row(
        "ResNet-50 DGX A100 TF32",
        _DLE_RN50,
        "NVLink A100",
        8,
        256,
        256 / 938.0,
        256 / 938.0 * 8 / 7.72,
        25_557_032,
    ),
    Row(
        "ResNet-50 DGX A100 AMP",
        _DLE_RN50,
        "NVLink A100",
        8,
        256,
        256 / 2470.0,
        256 / 2470.0 * 8 / 6.72,
        25_557_032,
    ),
    # pytorch/pytorch benchmarks/distributed/ddp/README.md: p50 0.097 s (no DDP), 0.104 s (8 GPUs)
    Row(
        "ResNet-50 PyTorch DDP benchmark V100",
        "pytorch/pytorch benchmarks/distributed/ddp",
        "NVLink V100",
        8,
        32,
        0.097,
        0.104,
        25_557_032,
    ),
)


CALIBRATION = {
    "Paddle DeepLabV3+ fp32": "collective",  # no host syncs: fits the collective spread
    "PyTorch DeepLabV3+ fp32": "host_sync",  # then, given it, the host-sync spread
}

# Misses as (low, high) bounds on predicted minus published efficiency, each explained.
KNOWN_MISSES: dict[str, tuple[float, float]] = {
    # Paddle's AMP step (0.24 s) loses 0.087 s on 8 GPUs against 0.060 s in fp32 with the
    # same layers and collectives: a per-step cost that AMP adds only with several GPUs
    # (its dynamic loss scaling all-reduces a found-inf flag and syncs the host once per
    # step) that the model does not have; the same row on 32 GPUs misses alike.
    "Paddle DeepLabV3+ AMP": (0.05, 0.13),
    "Paddle DeepLabV3+ AMP, 32 GPUs": (0.03, 0.10),
    # PaddleSeg's HRNet logs hold 10 iterations per run, the first 2 warm-up: 32 GPUs ran
    # faster per step (0.594 s) than 8 (0.610 s), which no model whose costs grow with the
    # rank count can follow; the 8-GPU fp32 row is 5.2 points below, in the same noisy logs.
    "Paddle HRNet-W18 fp32": (-0.08, -0.03),
    "Paddle HRNet-W18 fp32, 32 GPUs": (-0.20, -0.12),
    # DGX A100 AMP: 0.10 s steps on 8 GPUs decode and augment ~19,800 JPEG/s on one node's
    # CPUs; the model is given no data rate and predicts ~97 % against 84 %.
    "ResNet-50 DGX A100 AMP": (0.05, 0.15),
}

# Rows no perturbation moves by more than TOLERANCE (test_consistency_checks_cannot_...):
# predicted at 0.97 whatever their inputs, so they check, not validate, the model.
CONSISTENCY_CHECKS = (
    "PyTorch HRNet-W18 fp32, plain BN",
    "nnU-Net 2D A100 AMP",
    "nnU-Net 2D A100 TF32",
    "nnU-Net 2D V100 AMP",
    "nnU-Net 2D V100 FP32",
    "ResNet-50 DGX-1 V100 FP32",
    "ResNet-50 DGX A100 TF32",
    "ResNet-50 PyTorch DDP benchmark V100",
)

VALIDATIONS = tuple(
    row.case
    for row in ROWS
    if row.case not in CALIBRATION
    and row.case not in KNOWN_MISSES
    and row.case not in CONSISTENCY_CHECKS
)

PERTURBATIONS: dict[str, dict[str, float]] = {
    "one-GPU step halved": {"t1": 0.5},
    "all-reduce times doubled": {"link": 2.0},
    "arrival spreads doubled": {"spread": 2.0},
}
"""Inputs changed one at a time, as factors, to see whether a row can fail."""

# Terms that no published row can see, with why: a model without them passes every row.
UNSEEN_TERMS = {
    "overhead_s": "a published row gives one step time; its framework cost is in it, on 1 "
    "GPU as on N, and the model cannot split it out",
    "collectives_s": "the rows' frameworks have no loss normaliser; DDP's buffer broadcast "
    "is one small collective a step",
    "exposed_communication_s": "every row's gradients are all-reduced behind its backward "
    "pass (at most 2.6 ms of a 310 ms step exposed, on 32 GPUs over InfiniBand)",
}


def row_named(case: str) -> Row:
    return next(row for row in ROWS if row.case == case)


def predicted(
    row: Row,
    spread: ArrivalSpread = GPU_SPREAD,
    t1: float = 1.0,
    link: float = 1.0,
    spread_factor: float = 1.0,
) -> float:
    """The model's efficiency for ``row``, its one-GPU step, links and spreads scaled."""
    step = row.t1 * t1
    optimizer = OPTIMIZER_SHARE * step
    forward = (step - optimizer) / 3
    profile = StepProfile(forward, 2 * forward, optimizer, row.batch, JITTER)
    gradients = Gradients.uniform([row.parameters * 4 / 100] * 100)
    sync = None
    if row.sync_batchnorm:
        forward_n, backward_n, host_syncs = SYNC_BATCHNORM_COLLECTIVES[row.sync_batchnorm]
        sync = BatchNormSync(
            row.batchnorm_layers, STATISTICS_BYTES, forward_n, backward_n, host_syncs
        )
    host = spread.host(profile, sync)
    host = replace(
        host,
        skew_s=host.skew_s * spread_factor,
        host_sync_skew_s=host.host_sync_skew_s * spread_factor,
    )
    curve = find_interconnect(row.link)
    curve = Interconnect(curve.name, tuple((x, t * link) for x, t in curve.points), curve.source)
    return step_model.predict(profile, gradients, row.devices, curve, host, sync).efficiency


def largest_move(row: Row) -> float:
    """The most any of ``PERTURBATIONS`` moves ``row``'s prediction, in efficiency."""
    base = predicted(row)
    moves = []
    for factors in PERTURBATIONS.values():
        scaled = {"spread_factor" if k == "spread" else k: v for k, v in factors.items()}
        moves.append(abs(predicted(row, **scaled) - base))  # type: ignore[arg-type]
    return max(moves)


def fit(model: ArrivalSpread) -> ArrivalSpread:
    """``model`` with both constants fitted to the ``CALIBRATION`` rows, in order.

    Raises ``AssertionError`` when no constant up to 1000 times the model's meets a row.
    """
    for case, constant in CALIBRATION.items():
        row = row_named(case)

        def miss(
            value: float, constant: str = constant, row: Row = row, model: ArrivalSpread = model
        ) -> float:
            return predicted(row, replace(model, **{constant: value})) - row.efficiency

        low, high = 0.0, 1000 * getattr(model, constant)
        assert miss(low) > 0 > miss(high), f"no {constant} spread meets {case}"
        for _ in range(60):  # efficiency falls as the spread grows
            middle = (low + high) / 2
            low, high = (middle, high) if miss(middle) > 0 else (low, middle)
        model = replace(model, **{constant: (low + high) / 2})
    return model


def failed_assertion(row: Row, spread: ArrivalSpread = GPU_SPREAD) -> str | None:
    """What ``row``'s assertion says when it fails (``None`` when it holds)."""
    miss = predicted(row, spread) - row.efficiency
    if row.case in CALIBRATION:
        bound, ok = 0.002, abs(miss) <= 0.002
    elif row.case in KNOWN_MISSES:
        low, high = KNOWN_MISSES[row.case]
        bound, ok = high, low < miss < high
    else:
        bound, ok = TOLERANCE, abs(miss) <= TOLERANCE
    return None if ok else f"{row.case}: predicted - published = {miss:+.3f} (bound {bound})"


def every_failure(spread: ArrivalSpread = GPU_SPREAD) -> list[str]:
    """Each published-row assertion that fails."""
    return [text for row in ROWS if (text := failed_assertion(row, spread))]


def test_enough_rows_and_segmentation_with_sync_batchnorm():
    assert len(ROWS) >= 8
    assert len(VALIDATIONS) >= 5
    assert all(row_named(case).sync_batchnorm for case in VALIDATIONS)


def test_consistency_checks_are_the_rows_that_cannot_fail():
    # A row is a validation only if some perturbation moves it by more than the tolerance.
    # (Of the misses, DGX A100 AMP cannot move either: a 97 % any input gives.)
    cannot_fail = {
        row.case for row in ROWS if row.case not in KNOWN_MISSES and largest_move(row) <= TOLERANCE
    }
    assert cannot_fail == set(CONSISTENCY_CHECKS)


@pytest.mark.parametrize("model", [CONSTANT, PER_SEGMENT], ids=lambda model: model.name)
def test_the_spread_constants_are_fitted_to_the_calibration_rows(model):
    fitted = fit(model)
    assert fitted.collective == pytest.approx(model.collective, rel=0.01)
    assert fitted.host_sync == pytest.approx(model.host_sync, rel=0.01)


@pytest.mark.parametrize("case", CALIBRATION)
def test_the_calibration_rows_are_met(case):
    assert failed_assertion(row_named(case)) is None


@pytest.mark.parametrize("case", VALIDATIONS)
def test_predicted_efficiency_against_published(case):
    assert failed_assertion(row_named(case)) is None


@pytest.mark.parametrize("case", CONSISTENCY_CHECKS)
def test_consistency_check_within_tolerance(case):
    assert failed_assertion(row_named(case)) is None


@pytest.mark.parametrize("case", KNOWN_MISSES)
def test_known_miss_within_its_bounds(case):
    assert failed_assertion(row_named(case)) is None


def test_the_spread_model_kept_fits_the_rows_better():
    def score(model: ArrivalSpread) -> tuple[int, float]:
        rows = [row_named(case) for case in VALIDATIONS]
        misses = [abs(predicted(row, model) - row.efficiency) for row in rows]
        return sum(miss <= TOLERANCE for miss in misses), -sum(misses)

    kept, other = score(GPU_SPREAD), score(ALTERNATIVE)
    assert kept > other, (kept, other)
    assert every_failure(ALTERNATIVE), "the alternative passes every row: keep it instead"


def test_sync_batchnorm_is_what_separates_the_hrnet_rows():
    # The same network and GPUs: plain BN loses 8 %, PyTorch's SyncBN half the throughput;
    # the model has the difference from 322 layers × (2 collectives + 1 host sync).
    plain = row_named("PyTorch HRNet-W18 fp32, plain BN")
    synced = row_named("PyTorch HRNet-W18 fp32")
    assert predicted(plain) - predicted(synced) > 0.4


def _mutated(term: str, factor: float) -> Callable[..., step_model.Prediction]:
    original = step_model.from_terms

    def from_terms(n, interconnect, batch, terms, single, data_rate_n=None):
        return original(
            n, interconnect, batch, terms | {term: factor * terms[term]}, single, data_rate_n
        )

    return from_terms


SEEN_TERMS = [term for term in STEP_TERMS if term not in UNSEEN_TERMS]


@pytest.mark.parametrize("factor", [0.0, 2.0], ids=["dropped", "doubled"])
@pytest.mark.parametrize("term", SEEN_TERMS)
def test_a_step_model_without_a_term_fails_a_published_row(monkeypatch, term, factor):
    monkeypatch.setattr(step_model, "from_terms", _mutated(term, factor))
    assert every_failure()


@pytest.mark.parametrize("term", list(UNSEEN_TERMS))
def test_the_terms_no_published_row_sees(monkeypatch, term):
    # Dropped or doubled, they move no row by a tolerance: kept listed so that a row that
    # sees one (a slow link, a large model) moves it out of UNSEEN_TERMS.
    base = [predicted(row) for row in ROWS]
    for factor in (0.0, 2.0):
        monkeypatch.setattr(step_model, "from_terms", _mutated(term, factor))
        moved = [abs(predicted(row) - b) for row, b in zip(ROWS, base, strict=True)]
        monkeypatch.undo()
        assert max(moved) < TOLERANCE / 2
