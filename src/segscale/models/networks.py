"""The network: any segmentation_models_pytorch architecture and encoder, by name."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import segmentation_models_pytorch as smp
import torch
from segmentation_models_pytorch.base import SegmentationHead, SegmentationModel
from segmentation_models_pytorch.decoders.deeplabv3.decoder import DeepLabV3PlusDecoder
from torch import nn

from segscale.checks import ConfigError


def build_network(
    arch: str = "DeepLabV3Plus",
    encoder: str = "resnet18",
    num_classes: int = 6,
    in_channels: int = 3,
    output_stride: int | None = None,
    encoder_weights: str | None = None,
    **arch_kwargs: Any,
) -> nn.Module:
    """Build an smp network; ``encoder_weights`` is ``None`` or a local weights file.

    ``output_stride`` (8 or 16) applies to architectures that dilate their encoder
    (DeepLabV3, DeepLabV3+); it is an error for the others. Extra keyword arguments go
    to the architecture (``decoder_channels``, ...). Nothing is ever downloaded.
    """
    try:
        model_class = smp.MODEL_ARCHITECTURES_MAPPING[arch.lower()]
    except KeyError:
        names = sorted(cls.__name__ for cls in smp.MODEL_ARCHITECTURES_MAPPING.values())
        raise ConfigError(f"model.arch={arch!r} is unknown: expected one of {names}") from None
    if encoder not in smp.encoders.get_encoder_names() and not encoder.startswith("tu-"):
        raise ConfigError(
            f"model.encoder={encoder!r} is unknown: expected an smp encoder name such as "
            "resnet18, resnet50, mobilenet_v2, efficientnet-b0 "
            "(see smp.encoders.get_encoder_names())"
        )
    kwargs = dict(arch_kwargs)
    if output_stride is not None:
        if "encoder_output_stride" not in inspect.signature(model_class).parameters:
            raise ConfigError(
                f"model.output_stride={output_stride} is not supported by {model_class.__name__}; "
                "set it to null (only DeepLabV3 and DeepLabV3Plus have an output stride)"
            )
        kwargs["encoder_output_stride"] = output_stride
    try:
        network = model_class(
            encoder_name=encoder,
            encoder_weights=None,
            in_channels=in_channels,
            classes=num_classes,
            **kwargs,
        )
    except ValueError as error:
        if "dilated" not in str(error):
            raise
        # Encoders with pooling between stages (inceptionresnetv2, ...) cannot be dilated.
        if model_class is not smp.DeepLabV3Plus or output_stride != 16:
            raise ConfigError(
                f"model.encoder={encoder!r} cannot be dilated, so {model_class.__name__} cannot "
                f"reach model.output_stride={output_stride} with it; use DeepLabV3Plus with "
                "output_stride 16 (the encoder is then cut after its 1/16 stage)"
            ) from None
        del kwargs["encoder_output_stride"]
        network = TruncatedDeepLabV3Plus(encoder, in_channels, num_classes, **kwargs)
    if encoder_weights is not None:
        load_encoder_weights(network, Path(encoder_weights))
    return network


def load_encoder_weights(network: nn.Module, path: Path) -> None:
    """Load a local state dict (an encoder's, or a whole network's) into the encoder."""
    if not path.is_file():
        raise ConfigError(
            f"model.encoder_weights={str(path)!r}: no such file; expected a local .pth file"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state)
    # Accept an encoder's own keys, or a whole network's with an "encoder." prefix.
    prefix = "encoder."
    if any(k.startswith(prefix) for k in state):
        state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    missing = sorted(set(network.encoder.state_dict()) - set(state))
    if missing:
        raise ConfigError(
            f"model.encoder_weights={str(path)!r} does not fit the encoder: "
            f"{len(missing)} weights missing, for example {missing[:3]}"
        )
    # Extra keys (the classifier head of an ImageNet checkpoint) are expected and skipped.
    network.encoder.load_state_dict(state, strict=False)


class TruncatedDeepLabV3Plus(SegmentationModel):
    """DeepLabV3+ at output stride 16 on an encoder cut after its 1/16 stage.

    This is what MATLAB's ``deeplabv3plusLayers(..., 'DownsamplingFactor', 16)`` does for
    encoders that cannot be dilated, such as Inception-ResNet-v2: the ASPP module reads
    the 1/16 features and the encoder's last (1/32) stage is dropped, instead of being
    turned into dilated convolutions. It has smp's DeepLabV3+ decoder and head.
    """

    def __init__(
        self,
        encoder: str,
        in_channels: int = 3,
        classes: int = 6,
        decoder_channels: int = 256,
        decoder_atrous_rates: tuple[int, int, int] = (12, 24, 36),
        decoder_aspp_separable: bool = True,
        decoder_aspp_dropout: float = 0.5,
        upsampling: int = 4,
    ) -> None:
        super().__init__()
        # Four stages: the last features are at 1/16, with no dilation needed.
        self.encoder = smp.encoders.get_encoder(encoder, in_channels=in_channels, depth=4)
        self.decoder = DeepLabV3PlusDecoder(
            encoder_channels=self.encoder.out_channels,
            encoder_depth=4,
            out_channels=decoder_channels,
            atrous_rates=decoder_atrous_rates,
            output_stride=16,
            aspp_separable=decoder_aspp_separable,
            aspp_dropout=decoder_aspp_dropout,
        )
        self.segmentation_head = SegmentationHead(
            in_channels=decoder_channels, out_channels=classes, kernel_size=1, upsampling=upsampling
        )
        self.classification_head = None
        self.name = f"deeplabv3plus-{encoder}-os16"
        self.initialize()
