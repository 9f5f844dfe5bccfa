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
