import pytest
import torch

from segscale.checks import ConfigError
from segscale.models.networks import build_network


@pytest.mark.parametrize(
    ("arch", "kwargs"),
    [
        ("DeepLabV3Plus", {"output_stride": 16}),
        ("DeepLabV3Plus", {"output_stride": 8}),
        ("Unet", {}),
        ("FPN", {}),
    ],
)
def test_architectures_give_class_logits_at_input_size(arch, kwargs):
    network = build_network(arch, "resnet18", num_classes=5, in_channels=4, **kwargs).eval()
    with torch.no_grad():
        assert network(torch.zeros(1, 4, 64, 64)).shape == (1, 5, 64, 64)


def test_bad_names_and_strides_are_config_errors():
    with pytest.raises(ConfigError, match=r"model\.arch"):
        build_network("DeepLabV9")
    with pytest.raises(ConfigError, match=r"model\.encoder"):
        build_network(encoder="resnet7")
    with pytest.raises(ConfigError, match=r"model\.output_stride"):
        build_network("Unet", output_stride=16)


def test_encoder_weights_load_from_a_local_file(tmp_path):
    source = build_network(num_classes=3)
    path = tmp_path / "weights.pth"
    torch.save(source.state_dict(), path)  # a whole network: keys start with "encoder."
    target = build_network(num_classes=3, encoder_weights=str(path))
    for key, value in source.encoder.state_dict().items():
        assert torch.equal(value, target.encoder.state_dict()[key])
    with pytest.raises(ConfigError, match="no such file"):
        build_network(encoder_weights=str(tmp_path / "missing.pth"))


def test_inceptionresnetv2_runs_at_output_stride_16():
    """smp cannot dilate this encoder; the network cuts it after its 1/16 stage instead."""
    network = build_network("DeepLabV3Plus", "inceptionresnetv2", num_classes=6, output_stride=16)
    assert network.encoder.output_stride == 16
    image = torch.randn(2, 3, 64, 64)
    assert network.encoder(image)[-1].shape[-1] == 64 // 16
    logits = network(image)
    assert logits.shape == (2, 6, 64, 64)
    logits.mean().backward()
    assert all(p.grad is not None for p in network.decoder.parameters())
    with pytest.raises(ConfigError, match=r"cannot be dilated.*output_stride=8"):
        build_network("DeepLabV3Plus", "inceptionresnetv2", output_stride=8)
