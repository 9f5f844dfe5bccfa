"""The network: any segmentation_models_pytorch architecture and encoder, by name."""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any, cast, get_args, get_type_hints

import segmentation_models_pytorch as smp
import torch
from segmentation_models_pytorch.base import SegmentationHead, SegmentationModel
from segmentation_models_pytorch.decoders.deeplabv3.decoder import DeepLabV3PlusDecoder
from torch import nn

from segscale.errors import ConfigError
from segscale.models.pretrained import build_with_named_weights, named_weights, names_a_file
from segscale.models.weights import load_encoder_weights


def build_network(
    arch: str = "DeepLabV3Plus",
    encoder: str = "resnet18",
    num_classes: int = 6,
    in_channels: int = 3,
    output_stride: int | None = None,
    encoder_weights: str | None = None,
    **arch_kwargs: Any,
) -> nn.Module:
    """Build an smp network; ``encoder_weights`` is ``None``, a weights name or a local file.

    A name (``imagenet``, ``ssl``, a timm tag for ``tu-`` encoders; see
    ``segscale.models.pretrained``) is loaded by smp/timm from their cache, fetched
    there once when missing; a path (``.pth``, ``.pt``, ``.safetensors``) is read
    weights-only (``load_encoder_weights``). ``output_stride`` (8 or 16) applies to
    architectures that dilate their encoder (DeepLabV3, DeepLabV3+); it is an error for
    the others. Extra keyword arguments go to the architecture (``decoder_channels``, ...).
    """
    model_class = architecture(arch)
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

    def construct(encoder_name: str, weights: str | bool | None) -> nn.Module:
        return _construct(
            model_class, encoder_name, weights, in_channels, num_classes, output_stride, kwargs
        )

    if encoder_weights is not None and not names_a_file(encoder_weights):
        named = named_weights(encoder, encoder_weights)
        network = build_with_named_weights(
            named, lambda: construct(named.smp_encoder, named.argument)
        )
    else:
        network = construct(encoder, None)
        if encoder_weights is not None:
            load_encoder_weights(network, Path(encoder_weights))
    if isinstance(network, TruncatedDeepLabV3Plus):
        network.drop_unreached_layers()  # after the weights: their files hold every stage
    return network


def _construct(
    model_class: type[nn.Module],
    encoder: str,
    weights: str | bool | None,
    in_channels: int,
    num_classes: int,
    output_stride: int | None,
    kwargs: dict[str, Any],
) -> nn.Module:
    """The smp network; smp/timm load named ``weights`` (smp's ``encoder_weights``)."""
    try:
        return model_class(
            encoder_name=encoder,
            encoder_weights=weights,
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
        rest = {k: v for k, v in kwargs.items() if k != "encoder_output_stride"}
        return TruncatedDeepLabV3Plus(
            encoder, in_channels, num_classes, encoder_weights=weights, **rest
        )


class TruncatedDeepLabV3Plus(SegmentationModel):
    """DeepLabV3+ at output stride 16 on an encoder cut after its 1/16 stage.

    This is what MATLAB's ``deeplabv3plusLayers(..., 'DownsamplingFactor', 16)`` does for
    encoders that cannot be dilated, such as Inception-ResNet-v2: the ASPP module reads
    the 1/16 features and the encoder's last (1/32) stage is dropped, instead of being
    turned into dilated convolutions. It has smp's DeepLabV3+ decoder and head;
    ``encoder_weights`` is smp's (a weights name loads them, as ``get_encoder`` does).
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
        encoder_weights: str | bool | None = None,
    ) -> None:
        super().__init__()
        # Four stages: the last features are at 1/16, with no dilation needed.
        self.encoder = smp.encoders.get_encoder(
            encoder, in_channels=in_channels, depth=4, weights=encoder_weights
        )
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
        self.encoder_name, self.in_channels = encoder, in_channels
        self.initialize()

    def drop_unreached_layers(self) -> None:
        """Replace the encoder's layers its four stages never run by parameterless ones.

        smp builds the whole encoder at any depth (its ``forward`` skips the stages past
        ``depth``), so the cut stage keeps its weights: 27.4 M of Inception-ResNet-v2's
        56.2 M parameters, which would get no gradient. DDP stops at the second step on
        such parameters ("Expected to have finished reduction in the prior iteration")
        unless it searches the graph for them at every step (``find_unused_parameters``);
        they would also fill checkpoints and DDP's buckets. Called once the weights are
        loaded (a weights file holds every stage); a layer replaced keeps its place, so
        the encoder's own indexing (``features[a:b]``) is unchanged.
        """
        encoder = cast(nn.Module, self.encoder)
        for name in unreached_layers(self.encoder_name, self.in_channels):
            parent, _, leaf = name.rpartition(".")
            encoder.get_submodule(parent).register_module(leaf, nn.Identity())


@functools.lru_cache(maxsize=8)
def unreached_layers(encoder: str, in_channels: int) -> tuple[str, ...]:
    """The layers with weights or buffers that ``encoder`` at depth 4 never runs.

    Found by running the encoder once on the meta device (shapes only, no arithmetic and
    no memory: ~0.5 s for Inception-ResNet-v2) with a hook on every leaf layer.
    """
    with torch.device("meta"):
        probe = smp.encoders.get_encoder(encoder, in_channels=in_channels, depth=4, weights=None)
    reached: set[str] = set()
    leaves = [(n, m) for n, m in probe.named_modules() if n and not any(m.children())]
    hooks = [
        layer.register_forward_hook(lambda *_, name=name: reached.add(name))
        for name, layer in leaves
    ]
    with torch.no_grad():
        probe.eval()(torch.zeros(1, in_channels, 64, 64, device="meta"))
    for hook in hooks:
        hook.remove()
    return tuple(
        name
        for name, layer in leaves
        if name not in reached and [*layer.parameters(), *layer.buffers()]
    )


def architecture(arch: str) -> type[nn.Module]:
    """The smp architecture class that ``model.arch`` names (in any case)."""
    try:
        return smp.MODEL_ARCHITECTURES_MAPPING[arch.lower()]
    except KeyError:
        names = sorted(cls.__name__ for cls in smp.MODEL_ARCHITECTURES_MAPPING.values())
        raise ConfigError(f"model.arch={arch!r} is unknown: expected one of {names}") from None


def input_multiple(
    arch: str = "DeepLabV3Plus", output_stride: int | None = None, encoder_depth: int | None = None
) -> int | None:
    """What the input height and width of ``build_network``'s network must be a multiple of.

    smp 0.6 refuses other sides (``SegmentationModel.check_input_shape``) unless the
    architecture takes any size (U-Net: 1). The multiple is the encoder's output stride,
    ``min(stride, 2 ** depth)``: ``stride`` is ``output_stride`` for the architectures
    that dilate their encoder (DeepLabV3, DeepLabV3+, PAN; their own default when null)
    and 32 for the others, ``depth`` is ``encoder_depth`` (the architecture's default
    when null). An encoder that cannot be dilated is cut after its 1/16 stage instead
    (``TruncatedDeepLabV3Plus``): 16 as well, so the encoder does not change the rule.
    ``None`` for DPT, whose stride is its vision transformer's patch size, known only
    once it is built. An ``output_stride`` the architecture does not take is refused.
    """
    model_class = architecture(arch)
    if model_class is smp.DPT:
        return None
    if not getattr(model_class, "requires_divisible_input_shape", True):
        return 1
    parameters = inspect.signature(model_class).parameters
    depth = parameters["encoder_depth"].default if encoder_depth is None else encoder_depth
    if "encoder_output_stride" not in parameters:
        return min(32, 2**depth)
    stride = parameters["encoder_output_stride"].default if output_stride is None else output_stride
    allowed = get_args(get_type_hints(model_class.__init__)["encoder_output_stride"])
    if allowed and stride not in allowed:
        raise ConfigError(
            f"model.output_stride={stride!r} is not allowed: {model_class.__name__} takes "
            f"{' or '.join(map(str, allowed))}"
        )
    return min(stride, 2**depth)


def network_input_multiple(network: nn.Module) -> int:
    """What a built network's input height and width must be a multiple of (1: any size)."""
    if isinstance(network, SegmentationModel) and network.requires_divisible_input_shape:
        return int(network.encoder.output_stride)
    return 1


def check_input_side(side: Any, key: str, model: Any) -> None:
    """Raise ``ConfigError`` unless the network takes inputs ``side`` pixels high and wide.

    ``model`` is a ``model`` config (a mapping, checked before anything is built; only
    a config that ``build_network`` builds has a known rule) or a built network (one
    rebuilt from a checkpoint). ``key`` names the config key that gave ``side``; a side
    that is not a positive integer is left to the check that owns that key.
    """
    if isinstance(side, bool) or not isinstance(side, int) or side < 1:
        return
    if isinstance(model, nn.Module):
        multiple: int | None = network_input_multiple(model)
        network = f"{type(model).__name__} (output stride {multiple})"
    else:
        target = f"{build_network.__module__}.{build_network.__qualname__}"
        if model.get("_target_") != target:
            return
        defaults = inspect.signature(build_network).parameters
        arch = model.get("arch", defaults["arch"].default)
        encoder = model.get("encoder", defaults["encoder"].default)
        multiple = input_multiple(arch, model.get("output_stride"), model.get("encoder_depth"))
        network = f"{architecture(arch).__name__} ({encoder}, output stride {multiple})"
    if multiple is None or side % multiple == 0:
        return
    below = side // multiple * multiple
    neighbours = " or ".join(str(s) for s in (below, below + multiple) if s > 0)
    raise ConfigError(
        f"{key}={side} is not allowed: {network} takes sides that are multiples of "
        f"{multiple}, such as {neighbours}"
    )
