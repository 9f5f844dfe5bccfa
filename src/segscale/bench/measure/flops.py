"""FLOPs of a training step and the share of the device's peak that a step achieves.

The FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` on one forward
pass with the loss and its backward pass: convolutions and matrix products, as
2 × multiply-adds; elementwise work (normalization, activations, the loss,
interpolation) and the optimizer are not counted, as in every published FLOP count. The
count runs on the ``meta`` device, where no arithmetic is done, so it costs nothing
whatever the network.

The peaks are the dense (not 2:4 sparse) FLOP/s of each device's datasheet or
architecture whitepaper: a utilisation of 30-50% of the tensor-core peak is a good
training step; a few percent says that the device waits for something else.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

TERA = 1e12


@dataclass(frozen=True)
class DevicePeak:
    """A device's peak dense FLOP/s per number format (``None``: no such unit)."""

    name: str
    pattern: str  # matches the names torch.cuda.get_device_name() gives it
    fp32: float  # CUDA cores
    tf32: float | None  # tensor cores, fp32 inputs rounded to TF32
    bf16: float | None  # tensor cores, fp32 accumulation
    fp16: float | None  # tensor cores, fp32 accumulation
    source: str


def _peak(
    name: str,
    pattern: str,
    fp32: float,
    tf32: float | None,
    bf16: float | None,
    fp16: float | None,
    source: str,
) -> DevicePeak:
    """A table row from TFLOP/s."""
    tf32, bf16, fp16 = (None if v is None else v * TERA for v in (tf32, bf16, fp16))
    return DevicePeak(name, pattern, fp32 * TERA, tf32, bf16, fp16, source)


HOPPER = "NVIDIA {} Tensor Core GPU datasheet ({}: TF32 {}*, BF16/FP16 {}* TFLOPS)"

# Dense peaks in TFLOP/s: fp32, tf32, bf16, fp16. Datasheets give tensor-core figures
# with 2:4 sparsity (marked * there); the dense peak is half of those. The first row
# whose pattern matches a device's name is its row, so more specific names come first.
PEAKS: tuple[DevicePeak, ...] = (
    _peak(
        "NVIDIA GH200", r"\bGH200\b", 67, 494, 990, 990,
        "NVIDIA GH200 Grace Hopper Superchip datasheet",
    ),
    _peak(
        "NVIDIA H200 NVL", r"\bH200 NVL\b", 60, 417.5, 835.5, 835.5,
        HOPPER.format("H200", "H200 NVL", 835, "1,671"),
    ),
    _peak(
        "NVIDIA H200 SXM", r"\bH200\b", 67, 494.5, 989.5, 989.5,
        HOPPER.format("H200", "H200 SXM", 989, "1,979"),
    ),
    _peak(
        "NVIDIA H100 NVL", r"\bH100 NVL\b", 60, 417.5, 835.5, 835.5,
        HOPPER.format("H100", "H100 NVL", 835, "1,671"),
    ),
    _peak(
        "NVIDIA H100 PCIe", r"\bH100\b.*\bPCIe\b", 51, 378, 756, 756,
        HOPPER.format("H100", "H100 PCIe", 756, "1,513"),
    ),
    _peak(
        "NVIDIA H100 SXM", r"\bH100\b", 67, 494.5, 989.5, 989.5,
        HOPPER.format("H100", "H100 SXM", 989, "1,979"),
    ),
    _peak(
        "NVIDIA A100", r"\bA100\b", 19.5, 156, 312, 312,
        "NVIDIA A100 Tensor Core GPU datasheet",
    ),
    _peak("NVIDIA A30", r"\bA30\b", 10.3, 82, 165, 165, "NVIDIA A30 Tensor Core GPU datasheet"),
    _peak("NVIDIA A40", r"\bA40\b", 37.4, 74.8, 149.7, 149.7, "NVIDIA A40 datasheet"),
    _peak("NVIDIA A10", r"\bA10\b", 31.2, 62.5, 125, 125, "NVIDIA A10 Tensor Core GPU datasheet"),
    _peak("NVIDIA L40S", r"\bL40S\b", 91.6, 183, 362.05, 362.05, "NVIDIA L40S datasheet"),
    _peak("NVIDIA L40", r"\bL40\b", 90.5, 90.5, 181.05, 181.05, "NVIDIA L40 datasheet"),
    _peak("NVIDIA L4", r"\bL4\b", 30.3, 60, 121, 121, "NVIDIA L4 Tensor Core GPU datasheet"),
    # Volta and Turing: fp16 tensor cores only (no TF32, no bf16 units).
    _peak(
        "NVIDIA V100S PCIe", r"\bV100S\b", 16.4, None, None, 130,
        "NVIDIA V100 Tensor Core GPU datasheet",
    ),
    _peak(
        "NVIDIA V100 PCIe", r"\bV100-PCIE\b", 14, None, None, 112,
        "NVIDIA V100 Tensor Core GPU datasheet",
    ),
    _peak(
        "NVIDIA V100 SXM2", r"\bV100\b", 15.7, None, None, 125,
        "NVIDIA V100 Tensor Core GPU datasheet",
    ),
    _peak("NVIDIA T4", r"\bT4\b", 8.1, None, None, 65, "NVIDIA T4 Tensor Core GPU datasheet"),
    # GeForce: tensor cores at half rate with fp32 accumulation (what autocast uses).
    _peak(
        "NVIDIA GeForce RTX 4090", r"\bRTX 4090$", 82.6, 82.6, 165.2, 165.2,
        "NVIDIA Ada Lovelace GPU Architecture whitepaper, appendix A",
    ),
    _peak(
        "NVIDIA GeForce RTX 3090", r"\bRTX 3090$", 35.6, 35.6, 71, 71,
        "NVIDIA Ampere GA102 GPU Architecture whitepaper, appendix A",
    ),
)  # fmt: skip

SIXTEEN_BIT = {"bf16-mixed": "bf16", "bf16-true": "bf16", "bf16": "bf16"}
SIXTEEN_BIT |= {"16-mixed": "fp16", "16-true": "fp16", "16": "fp16"}
FULL = ("32-true", "32")


@dataclass(frozen=True)
class Peak:
    """The peak that applies to a step: the device's row and number format."""

    device: str
    number_format: str  # fp32, tf32, bf16 or fp16
    flops_per_s: float
    source: str


def device_peak(device_name: str) -> DevicePeak | None:
    """The table row of ``torch.cuda.get_device_name()``'s ``device_name``; None if unknown."""
    return next((row for row in PEAKS if re.search(row.pattern, device_name, re.IGNORECASE)), None)


def tf32_allowed() -> bool:
    """Whether fp32 convolutions or matrix products may run on TF32 tensor cores.

    Convolutions (``torch.backends.cudnn.allow_tf32``, on by default) do almost all of a
    segmentation network's FLOPs; matrix products (``torch.backends.cuda.matmul``) too.
    """
    return bool(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)


def peak_flops(device_name: str, precision: str, tf32: bool | None = None) -> Peak | None:
    """The dense peak FLOP/s of ``device_name`` under ``trainer.precision`` ``precision``.

    Full precision uses the TF32 tensor-core peak where ``tf32`` (default: as torch is
    set now, ``tf32_allowed``) and the device has one, else the CUDA cores'; 16-bit
    (mixed or true) the tensor-core peak of that format. ``None`` for an unknown device,
    a format the device has no peak for (bf16 before Ampere) or another precision.
    """
    row = device_peak(device_name)
    if row is None:
        return None
    precision = str(precision)
    if precision in FULL:
        tf32 = tf32_allowed() if tf32 is None else tf32
        number_format = "tf32" if tf32 and row.tf32 is not None else "fp32"
    elif precision in SIXTEEN_BIT:
        number_format = SIXTEEN_BIT[precision]
    else:
        return None
    value = getattr(row, number_format)
    return None if value is None else Peak(row.name, number_format, value, row.source)


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training step per patch: forward (with the loss) and backward."""

    forward: float
    backward: float

    @property
    def total(self) -> float:
        """Forward and backward."""
        return self.forward + self.backward


def _conv_backward_flop(
    grad_out_shape: Any,
    x_shape: Any,
    w_shape: Any,
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _output_padding: Any,
    _groups: int,
    output_mask: list[bool],
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    """A convolution's backward: each gradient asked for costs what the forward did.

    torch's own formula counts the weight gradient of a grouped convolution ``groups``
    times over (pytorch/pytorch#183405): 512× for a depthwise 512-channel one, which
    would add 70% to DeepLabV3+'s backward count.
    """
    forward = conv_flop_count(x_shape, w_shape, grad_out_shape, transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def training_flops(module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> StepFlops:
    """FLOPs per patch of one training step of ``module`` on ``batch``.

    The module's ``forward`` on ``batch["image"]`` and its ``loss_fn`` against
    ``batch["mask"]``, then the backward pass, counted on a copy on the ``meta`` device
    (nothing is computed; the module is left as it was), divided by the batch size.
    """
    twin = copy.deepcopy(module)
    for part in twin.modules():  # nn.Module.compile: count the plain network
        if getattr(part, "_compiled_call_impl", None) is not None:
            part._compiled_call_impl = None
    twin = twin.to("meta").train()
    image, mask = batch["image"].to("meta"), batch["mask"].to("meta").long()
    mapping = {torch.ops.aten.convolution_backward: _conv_backward_flop}
    with FlopCounterMode(display=False, custom_mapping=mapping) as forward:
        loss = cast(nn.Module, twin.loss_fn)(twin(image), mask).mean()
    with FlopCounterMode(display=False, custom_mapping=mapping) as backward:
        loss.backward()
    patches = int(batch["image"].shape[0])
    return StepFlops(forward.get_total_flops() / patches, backward.get_total_flops() / patches)


@dataclass(frozen=True)
class Utilisation:
    """A step's FLOPs, the FLOP/s it achieved and their share of the device's peak."""

    flops_per_patch: float  # forward + backward
    forward_flops_per_patch: float
    backward_flops_per_patch: float
    patches_per_step: int
    step_s: float
    achieved_flops_per_s: float
    device: str  # as torch names it (or "cpu")
    precision: str
    peak: Peak | None  # None: not a device of the table (every CPU)
    utilisation: float | None  # achieved / peak

    def as_dict(self) -> dict[str, Any]:
        """Plain numbers (for ``bench.json``)."""
        return asdict(self)


def utilisation(
    flops: StepFlops,
    patches_per_step: int,
    step_s: float,
    device_name: str,
    precision: str,
    tf32: bool | None = None,
) -> Utilisation:
    """What a step of ``patches_per_step`` patches in ``step_s`` seconds achieves."""
    if not (step_s > 0 and math.isfinite(step_s)):
        raise ValueError(f"step_s={step_s}: expected a measured step time in seconds (> 0)")
    achieved = flops.total * patches_per_step / step_s
    peak = peak_flops(device_name, precision, tf32)
    return Utilisation(
        flops_per_patch=flops.total,
        forward_flops_per_patch=flops.forward,
        backward_flops_per_patch=flops.backward,
        patches_per_step=patches_per_step,
        step_s=step_s,
        achieved_flops_per_s=achieved,
        device=device_name,
        precision=str(precision),
        peak=peak,
        utilisation=achieved / peak.flops_per_s if peak else None,
    )


def measure_utilisation(
    module: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    step_s: float,
    device: torch.device,
    precision: str,
) -> Utilisation:
    """FLOPs of ``module``'s step on ``batch`` and what a measured ``step_s`` makes of them."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return utilisation(
        training_flops(module, batch), int(batch["image"].shape[0]), step_s, name, precision
    )
