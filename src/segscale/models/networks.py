"""The network: any segmentation_models_pytorch architecture and encoder, by name."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import segmentation_models_pytorch as smp
import torch
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
    network = model_class(
        encoder_name=encoder,
        encoder_weights=None,
        in_channels=in_channels,
        classes=num_classes,
        **kwargs,
    )
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
