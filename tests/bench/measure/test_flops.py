import pytest
import torch
from torch import nn

from segscale.bench.measure.flops import (
    PEAKS,
    StepFlops,
    device_peak,
    peak_flops,
    training_flops,
    utilisation,
)
from segscale.models.module import SegmentationModule

SIDE = 8


def module_of(network: nn.Module, in_channels: int = 3) -> SegmentationModule:
    return SegmentationModule(
        network=network,
        optimizer=None,
        num_classes=4,
        class_names=[f"c{k}" for k in range(4)],
        mean=[0.0] * in_channels,
        std=[1.0] * in_channels,
    )


def batch_of(size: int, in_channels: int = 3) -> dict[str, torch.Tensor]:
    return {
        "image": torch.randint(0, 256, (size, in_channels, SIDE, SIDE)).byte(),
        "mask": torch.randint(0, 4, (size, SIDE, SIDE)).byte(),
    }


def conv_flops(c_in: int, c_out: int, k: int, groups: int = 1) -> int:
    """2 × multiply-adds of one sample's convolution (stride 1, same padding)."""
    return 2 * (c_in // groups) * c_out * k * k * SIDE * SIDE


def test_a_single_convolution_by_hand():
    flops = training_flops(module_of(nn.Conv2d(3, 4, 3, padding=1)), batch_of(2))
    assert flops.forward == conv_flops(3, 4, 3)
    # The image needs no gradient: the backward pass is the weight gradient alone.
    assert flops.backward == conv_flops(3, 4, 3)


def test_backward_is_about_twice_the_forward():
    network = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))
    flops = training_flops(module_of(network), batch_of(2))
    first, second = conv_flops(3, 8, 3), conv_flops(8, 4, 3)
    assert flops.forward == first + second
    # weight gradients of both, the input gradient of the second
    assert flops.backward == first + 2 * second
    assert flops.total == 2 * first + 3 * second


def test_a_grouped_convolution_is_counted_once_per_gradient():
    # torch's formula counts a grouped weight gradient `groups` times (pytorch#183405).
    network = nn.Sequential(nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 3, padding=1, groups=8))
    flops = training_flops(module_of(network), batch_of(2))
    first, depthwise = conv_flops(3, 8, 1), conv_flops(8, 8, 3, groups=8)
    assert flops.forward == first + depthwise
    assert flops.backward == first + 2 * depthwise


def test_flops_are_per_patch_and_leave_the_module_as_it_was():
    module = module_of(nn.Conv2d(3, 4, 3, padding=1))
    one, four = training_flops(module, batch_of(1)), training_flops(module, batch_of(4))
    assert one == four
    assert module.network.weight.device.type == "cpu" and module.network.weight.grad is None


def test_deeplabv3plus_backward_is_about_twice_its_forward():
    from segscale.models.networks import build_network

    network = build_network("DeepLabV3Plus", "resnet18", num_classes=4, output_stride=16)
    batch = {"image": torch.zeros(2, 3, 64, 64), "mask": torch.zeros(2, 64, 64).byte()}
    flops = training_flops(module_of(network), batch)
    assert flops.forward > 0
    assert 1.9 < flops.backward / flops.forward < 2.0  # all but the first conv's input gradient


@pytest.mark.parametrize(
    ("name", "row"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
        ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
        ("NVIDIA H200", "NVIDIA H200 SXM"),
        ("NVIDIA GH200 480GB", "NVIDIA GH200"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100"),
        ("Tesla V100-SXM2-16GB", "NVIDIA V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "NVIDIA V100 PCIe"),
        ("Tesla V100S-PCIE-32GB", "NVIDIA V100S PCIe"),
        ("NVIDIA L4", "NVIDIA L4"),
        ("NVIDIA L40S", "NVIDIA L40S"),
        ("NVIDIA A10", "NVIDIA A10"),
        ("Tesla T4", "NVIDIA T4"),
        ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
    ],
)
def test_device_names_find_their_row(name, row):
    assert device_peak(name).name == row


@pytest.mark.parametrize(
    "name",
    ["NVIDIA A10G", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 4090 Laptop GPU", "cpu", ""],
)
def test_unknown_devices_have_no_peak(name):
    assert device_peak(name) is None
    assert peak_flops(name, "bf16-mixed") is None


def test_the_precision_picks_the_peak():
    h100 = "NVIDIA H100 80GB HBM3"
    assert peak_flops(h100, "32-true", tf32=False).flops_per_s == 67e12
    assert peak_flops(h100, "32-true", tf32=True).flops_per_s == 494.5e12
    assert peak_flops(h100, "32", tf32=True).number_format == "tf32"
    assert peak_flops(h100, "bf16-mixed").flops_per_s == 989.5e12
    assert peak_flops(h100, "16-mixed").number_format == "fp16"
    assert peak_flops(h100, "64-true") is None
    # No TF32 or bf16 units on a V100: its fp32 peak, and no bf16 peak.
    assert peak_flops("Tesla V100-SXM2-16GB", "32-true", tf32=True).number_format == "fp32"
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16-mixed") is None


@pytest.fixture
def tf32_flags():
    """Restores torch's TF32 switches (module attributes monkeypatch cannot restore)."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def test_tf32_follows_torch_settings(tf32_flags):
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    assert peak_flops("NVIDIA A100-SXM4-80GB", "32-true").number_format == "fp32"
    torch.backends.cudnn.allow_tf32 = True  # convolutions: almost all of the FLOPs
    assert peak_flops("NVIDIA A100-SXM4-80GB", "32-true").number_format == "tf32"


def test_every_row_is_sourced_and_consistent():
    for row in PEAKS:
        assert row.source and row.fp32 > 0
        tensor = [p for p in (row.tf32, row.bf16, row.fp16) if p is not None]
        assert all(p >= row.fp32 for p in tensor)


def test_utilisation_arithmetic():
    flops = StepFlops(forward=1e9, backward=2e9)
    result = utilisation(flops, 8, 0.01, "NVIDIA H100 80GB HBM3", "bf16-mixed")
    assert result.flops_per_patch == 3e9
    assert result.achieved_flops_per_s == pytest.approx(2.4e12)
    assert result.utilisation == pytest.approx(2.4e12 / 989.5e12)
    assert result.as_dict()["peak"]["number_format"] == "bf16"
    on_cpu = utilisation(flops, 8, 0.5, "cpu", "32-true")
    assert on_cpu.peak is None and on_cpu.utilisation is None
    assert on_cpu.achieved_flops_per_s == pytest.approx(48e9)
    with pytest.raises(ValueError, match="step_s"):
        utilisation(flops, 8, 0.0, "cpu", "32-true")
