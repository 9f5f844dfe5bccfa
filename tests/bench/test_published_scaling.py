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
- the arrival spreads ``GPU_COLLECTIVE_SKEW_S`` and ``GPU_HOST_SYNC_SKEW_S``, each fitted
  to one row (``CALIBRATION``); the others are predictions;
- all-reduce times from the interconnect curves (``segscale.bench.interconnects``).

A row is right within ``TOLERANCE`` (5 percentage points). A row the model misses
(``KNOWN_MISSES``) is asserted with its miss's sign and size and explained beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from segscale.bench.interconnects import find_interconnect
from segscale.bench.prediction import (
    GPU_COLLECTIVE_SKEW_S,
    GPU_HOST_SYNC_SKEW_S,
    SYNC_BATCHNORM_COLLECTIVES,
    BatchNormSync,
    Gradients,
    Host,
    StepProfile,
    predict,
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
    "Paddle DeepLabV3+ fp32": "GPU_COLLECTIVE_SKEW_S",
    "PyTorch DeepLabV3+ fp32": "GPU_HOST_SYNC_SKEW_S",
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


def predicted(row: Row) -> float:
    """The model's efficiency for ``row`` under the module's assumptions."""
    optimizer = OPTIMIZER_SHARE * row.t1
    forward = (row.t1 - optimizer) / 3
    profile = StepProfile(forward, 2 * forward, optimizer, row.batch, JITTER)
    gradients = Gradients.uniform([row.parameters * 4 / 100] * 100)
    sync = None
    if row.sync_batchnorm:
        forward_n, backward_n, host_syncs = SYNC_BATCHNORM_COLLECTIVES[row.sync_batchnorm]
        sync = BatchNormSync(
            row.batchnorm_layers, STATISTICS_BYTES, forward_n, backward_n, host_syncs
        )
    host = Host(skew_s=GPU_COLLECTIVE_SKEW_S, host_sync_skew_s=GPU_HOST_SYNC_SKEW_S)
    link = find_interconnect(row.link)
    return predict(profile, gradients, row.devices, link, host, sync).efficiency


def test_enough_rows_and_segmentation_with_sync_batchnorm():
    assert len(ROWS) >= 8
    validated = [r for r in ROWS if r.case not in CALIBRATION and r.case not in KNOWN_MISSES]
    assert len(validated) >= 8
    assert sum(1 for r in validated if r.sync_batchnorm) >= 3


@pytest.mark.parametrize("case", CALIBRATION)
def test_the_calibration_rows_are_met(case):
    row = next(r for r in ROWS if r.case == case)
    assert predicted(row) == pytest.approx(row.efficiency, abs=0.002)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.case)
def test_predicted_efficiency_against_published(row):
    miss = predicted(row) - row.efficiency
    if row.case in KNOWN_MISSES:
        low, high = KNOWN_MISSES[row.case]
        assert low < miss < high
    else:
        assert abs(miss) <= TOLERANCE


def test_sync_batchnorm_is_what_separates_the_hrnet_rows():
    # The same network and GPUs: plain BN loses 8 %, PyTorch's SyncBN half the throughput;
    # the model has the difference from 322 layers × (2 collectives + 1 host sync).
    plain = next(r for r in ROWS if r.case == "PyTorch HRNet-W18 fp32, plain BN")
    synced = next(r for r in ROWS if r.case == "PyTorch HRNet-W18 fp32")
    assert predicted(plain) - predicted(synced) > 0.4
