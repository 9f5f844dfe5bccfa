import pytest
import safetensors.torch
import timm
import torch
import torchvision

from segscale.errors import ConfigError
from segscale.models.networks import build_network
from segscale.models.weights import read_weights


class WritesAFile:
    """A pickle payload: unpickling it would create ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path):
    marker, path = tmp_path / "ran", tmp_path / "weights.pth"
    torch.save({"conv1.weight": torch.zeros(1), "payload": WritesAFile(marker)}, path)
    with pytest.raises(
        ConfigError, match=r"model\.encoder_weights='.*weights\.pth' cannot be read"
    ):
        build_network(encoder_weights=str(path))
    assert not marker.exists()


def test_an_imagenet_classifier_file_loads_into_the_encoder(tmp_path):
    # torchvision's layout: the classifier head (fc) and no num_batches_tracked counters.
    state = torchvision.models.resnet18().state_dict()
    state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    path = tmp_path / "resnet18.pth"
    torch.save(state, path)
    network = build_network(num_classes=3, encoder_weights=str(path))
    assert torch.equal(network.encoder.conv1.weight, state["conv1.weight"])


def test_another_encoders_file_is_refused_with_its_keys(tmp_path):
    # A ResNet-34's weights cover every ResNet-18 key with the right shape: only the
    # extra blocks tell them apart.
    path = tmp_path / "resnet34.pth"
    torch.save(build_network(encoder="resnet34").encoder.state_dict(), path)
    with pytest.raises(ConfigError) as error:
        build_network(encoder="resnet18", encoder_weights=str(path))
    message = str(error.value)
    assert "model.encoder_weights=" in message and "resnet34.pth" in message
    assert "unexpected: layer1.2.conv1.weight" in message
    assert "more)" in message  # a few keys, then a count


def test_a_file_with_other_shapes_is_refused_with_the_shapes(tmp_path):
    path = tmp_path / "rgb.pth"
    torch.save(build_network(in_channels=3).encoder.state_dict(), path)
    with pytest.raises(
        ConfigError,
        match=r"1 with another shape: conv1\.weight \(file 64×3×7×7, "
        r"network 64×4×7×7\)",
    ):
        build_network(in_channels=4, encoder_weights=str(path))


def test_read_weights_names_a_damaged_file(tmp_path):
    path = tmp_path / "half.pth"
    torch.save({"w": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(ConfigError, match=r"ckpt='.*half\.pth' cannot be read as weights"):
        read_weights(path, "ckpt", "a checkpoint")


def test_a_whole_networks_safetensors_file_loads_into_the_encoder(tmp_path):
    source = build_network(num_classes=3)
    path = tmp_path / "network.safetensors"
    safetensors.torch.save_file(source.state_dict(), path)  # keys start with "encoder."
    target = build_network(num_classes=3, encoder_weights=str(path))
    for key, value in source.encoder.state_dict().items():
        assert torch.equal(value, target.encoder.state_dict()[key])


def test_an_encoders_pt_file_loads(tmp_path):
    source = build_network("Unet", "tu-resnet18", num_classes=3)
    path = tmp_path / "encoder.pt"
    torch.save(source.encoder.state_dict(), path)  # smp's own keys: "model." for tu- encoders
    target = build_network("Unet", "tu-resnet18", num_classes=3, encoder_weights=str(path))
    assert torch.equal(target.encoder.model.conv1.weight, source.encoder.model.conv1.weight)


@pytest.mark.parametrize("model", ["resnet18", "convnext_atto"])
def test_a_plain_timm_file_loads_into_a_timm_encoder(tmp_path, model):
    # timm's classifier layout: no "model." prefix, a head, and (ConvNeXt) "stages.0"
    # where smp's feature extractor has "stages_0".
    state = timm.create_model(model).state_dict()
    path = tmp_path / f"{model}.safetensors"
    safetensors.torch.save_file(state, path)
    network = build_network("Unet", f"tu-{model}", num_classes=3, encoder_weights=str(path))
    for key, value in network.encoder.state_dict().items():
        plain = key.removeprefix("model.")
        assert torch.equal(value, state.get(plain, state.get(plain.replace("_", ".", 1))))


def test_another_timm_models_file_is_refused_with_its_keys(tmp_path):
    path = tmp_path / "resnet34.pth"
    torch.save(timm.create_model("resnet34").state_dict(), path)
    with pytest.raises(
        ConfigError,
        match=r"resnet34\.pth' does not fit the encoder "
        r"\(TimmUniversalEncoder\): \d+ unexpected: model\.layer1\.2\.conv1\.weight",
    ):
        build_network("Unet", "tu-resnet18", encoder_weights=str(path))


def test_a_damaged_safetensors_file_is_named(tmp_path):
    path = tmp_path / "half.safetensors"
    safetensors.torch.save_file({"w": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(
        ConfigError,
        match=r"model\.encoder_weights='.*half\.safetensors' cannot be read as safetensors",
    ):
        build_network(encoder_weights=str(path))
