import pytest
import torch

from segscale.errors import ConfigError
from segscale.models.networks import (
    build_network,
    check_input_side,
    input_multiple,
    network_input_multiple,
)
from segscale.training.run.training_run import train
from tests.conftest import compose_config, tiny_overrides

TARGET = "segscale.models.networks.build_network"


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


@pytest.mark.parametrize("encoder", ["inceptionresnetv2", "xception", "densenet121"])
def test_an_encoder_that_cannot_be_dilated_is_cut_after_its_1_16_stage(encoder):
    """smp cannot dilate these encoders; the network cuts them after their 1/16 stage."""
    network = build_network("DeepLabV3Plus", encoder, num_classes=6, output_stride=16)
    assert network.encoder.output_stride == 16
    image = torch.randn(2, 3, 64, 64)
    assert network.encoder(image)[-1].shape[-1] == 64 // 16
    logits = network(image)
    assert logits.shape == (2, 6, 64, 64)
    logits.mean().backward()
    # every weight it keeps gets a gradient (DDP waits for each); the cut stage has none
    assert all(p.grad is not None for p in network.parameters())
    with pytest.raises(ConfigError, match=r"cannot be dilated.*output_stride=8"):
        build_network("DeepLabV3Plus", encoder, output_stride=8)


STRIDE_CASES = [
    ("DeepLabV3Plus", "resnet18", {"output_stride": 16}, 16),
    ("DeepLabV3Plus", "resnet18", {"output_stride": 8}, 8),
    ("DeepLabV3Plus", "resnet18", {"output_stride": 16, "encoder_depth": 3}, 8),
    ("DeepLabV3", "resnet18", {}, 8),  # smp's own default output stride
    ("Unet", "resnet18", {}, 1),  # smp's U-Net takes any size
    ("FPN", "resnet18", {}, 32),
    ("PSPNet", "resnet18", {}, 8),  # encoder_depth 3 by default
    ("DeepLabV3Plus", "inceptionresnetv2", {"output_stride": 16}, 16),  # truncated
]


@pytest.mark.parametrize(
    ("arch", "encoder", "kwargs", "multiple"),
    STRIDE_CASES,
    ids=[f"{a}-{e}-{k}" for a, e, k, _ in STRIDE_CASES],
)
def test_input_multiple_is_what_the_built_network_takes(arch, encoder, kwargs, multiple):
    network = build_network(arch, encoder, num_classes=3, **kwargs).eval()
    stride = kwargs.get("output_stride")
    assert input_multiple(arch, stride, kwargs.get("encoder_depth")) == multiple
    assert network_input_multiple(network) == multiple
    side = 4 * multiple if multiple > 1 else 37
    with torch.no_grad():
        assert network(torch.zeros(1, 3, side, side)).shape[-2:] == (side, side)
        if multiple > 1:  # half a stride more is refused, as smp checks it
            with pytest.raises(RuntimeError, match=f"divisible by {multiple}"):
                network(torch.zeros(1, 3, side + multiple // 2, side))


def test_patch_size_must_be_a_multiple_of_the_output_stride():
    model = compose_config("train").model  # DeepLabV3+ on resnet18 at output stride 16
    with pytest.raises(ConfigError) as error:
        check_input_side(100, "datamodule.patch_size", model)
    assert str(error.value) == (
        "datamodule.patch_size=100 is not allowed: DeepLabV3Plus (resnet18, output stride 16) "
        "takes sides that are multiples of 16, such as 96 or 112"
    )
    with pytest.raises(ConfigError, match=r"such as 16$"):
        check_input_side(8, "datamodule.patch_size", model)
    check_input_side(96, "datamodule.patch_size", model)
    check_input_side(100, "datamodule.patch_size", compose_config("train", "model=unet").model)
    with pytest.raises(ConfigError, match=r"FPN \(resnet18, output stride 32\).*96 or 128"):
        check_input_side(100, "datamodule.patch_size", compose_config("train", "model=fpn").model)


def test_other_models_and_values_are_left_to_their_own_checks():
    check_input_side(100, "datamodule.patch_size", {"_target_": "torch.nn.Conv2d"})
    check_input_side(True, "datamodule.patch_size", {"_target_": TARGET, "arch": "FPN"})
    check_input_side(-5, "datamodule.patch_size", {"_target_": TARGET, "arch": "FPN"})
    assert input_multiple("DPT") is None  # a ViT's patch size: known once built


def test_bad_output_stride_and_arch_are_refused_before_building():
    with pytest.raises(ConfigError, match=r"model\.output_stride=12 .*DeepLabV3Plus takes 8 or 16"):
        input_multiple("DeepLabV3Plus", output_stride=12)
    with pytest.raises(ConfigError, match=r"model\.arch='DeepLabV9' is unknown"):
        input_multiple("DeepLabV9")


def test_tile_size_is_checked_against_a_built_network():
    network = build_network(num_classes=3)
    with pytest.raises(ConfigError) as error:
        check_input_side(500, "inference.tile_size", network)
    assert str(error.value) == (
        "inference.tile_size=500 is not allowed: DeepLabV3Plus (output stride 16) takes "
        "sides that are multiples of 16, such as 496 or 512"
    )
    check_input_side(512, "inference.tile_size", network)
    check_input_side(500, "inference.tile_size", torch.nn.Conv2d(3, 3, 1))


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "arch"), [("segformer", "Segformer"), ("upernet", "UPerNet")])
def test_the_segformer_and_upernet_presets_train_a_few_steps(
    preset, arch, tiny_data_root, tmp_path
):
    # The preset as it is (its own encoder, not the tiny runs' one), on 32-px patches.
    overrides = [
        o for o in tiny_overrides(tiny_data_root, tmp_path) if not o.startswith("model.encoder")
    ]
    cfg = compose_config(
        "train",
        *overrides,
        f"model={preset}",
        "datamodule.patch_size=32",
        "trainer.max_epochs=1",
        "trainer.max_steps=2",
        "trainer.limit_val_batches=1",
    )
    assert cfg.model.arch == arch and cfg.model.output_stride is None
    summary = train(cfg)
    assert summary["status"] == "finished"
    assert summary["steps"] == 2
