from __future__ import annotations

import numpy as np
import pytest
import segmentation_models_pytorch as smp
import torch
from hydra.utils import instantiate
from torch import nn

from segscale.errors import ConfigError
from segscale.inference.sliding_window import SlidingWindow
from tests.conftest import compose_config
from tests.inference.test_sliding_window import (
    CLASSES,
    context_model,
    pointwise_model,
    random_image,
)


def probabilities(window: SlidingWindow, model: nn.Module, image: np.ndarray) -> np.ndarray:
    return np.concatenate([p for _, p in window.probability_bands(model, image, CLASSES)], axis=1)


def softmax(model: nn.Module, image: np.ndarray) -> np.ndarray:
    """The network's softmax of one whole ``H×W×C`` image, as ``K×H×W``."""
    with torch.inference_mode():
        batch = torch.from_numpy(np.ascontiguousarray(image, np.float32)).permute(2, 0, 1)[None]
        return model(batch).softmax(1)[0].numpy()


@pytest.mark.parametrize("shape", [(32, 32), (64, 96)])
def test_d4_makes_any_network_equivariant_to_the_square_s_symmetries(shape) -> None:
    """Predicting a rotated or mirrored image is rotating or mirroring the prediction."""
    model, image = context_model(), random_image(*shape)  # no symmetry of its own
    d4 = SlidingWindow(tile_size=32, overlap=0.0, tta="d4")
    plain = SlidingWindow(tile_size=32, overlap=0.0)
    expected = probabilities(d4, model, image)
    for turns in (1, 2, 3):
        turned = probabilities(d4, model, np.rot90(image, turns, axes=(0, 1)))
        np.testing.assert_allclose(turned, np.rot90(expected, turns, axes=(1, 2)), atol=1e-6)
        labels = d4.predict(model, np.rot90(image, turns, axes=(0, 1)), CLASSES)
        np.testing.assert_array_equal(labels, np.rot90(expected.argmax(0), turns))
    mirrored = probabilities(d4, model, image[:, ::-1])
    np.testing.assert_allclose(mirrored, expected[:, :, ::-1], atol=1e-6)
    # Without it the network is not: the check can fail.
    unturned = probabilities(plain, model, np.rot90(image, 1, axes=(0, 1)))
    assert (
        np.abs(unturned - np.rot90(probabilities(plain, model, image), 1, axes=(1, 2))).max() > 1e-3
    )


def test_d4_is_the_mean_of_the_eight_views_softmax() -> None:
    """Averaged in probability space: each view's softmax turned back, then the mean."""
    model, image = context_model(), random_image(32, 32)
    views = []
    for turns in range(4):
        for mirror in (False, True):
            view = np.rot90(image, turns, axes=(0, 1))
            view = view[:, ::-1] if mirror else view
            back = softmax(model, view)
            back = back[:, :, ::-1] if mirror else back
            views.append(np.rot90(back, -turns, axes=(1, 2)))
    window = SlidingWindow(tile_size=32, tta="d4")
    got = probabilities(window, model, image)
    np.testing.assert_allclose(got, np.mean(views, axis=0), atol=1e-6)
    np.testing.assert_allclose(got.sum(0), 1, atol=1e-5)
    logits_mean = np.mean([np.log(v) for v in views], axis=0)  # the other way to average
    assert np.abs(got - np.exp(logits_mean) / np.exp(logits_mean).sum(0)).max() > 1e-4


def test_flip_is_the_flip_tta_of_before() -> None:
    """tta=flip: the tile, its left-right and its up-down flip, as flip_tta=true did."""
    model, image = context_model(), random_image(32, 32)
    with torch.inference_mode():  # the code of flip_tta=true, as it was
        batch = torch.from_numpy(image[None]).permute(0, 3, 1, 2)
        expected = model(batch).softmax(1)
        for dim in (-1, -2):
            expected += model(batch.flip(dim)).softmax(1).flip(dim)
        expected /= 3
    got = probabilities(SlidingWindow(tile_size=32, tta="flip", blend="none"), model, image)
    np.testing.assert_allclose(got, expected[0].numpy(), rtol=0, atol=1e-7)


def test_hflip_averages_the_tile_and_its_left_right_mirror() -> None:
    """tta=hflip (mmseg's flip): a left-right mirror image gives the mirrored prediction."""
    model, image = context_model(), random_image(32, 32)
    with torch.inference_mode():
        batch = torch.from_numpy(image[None]).permute(0, 3, 1, 2)
        expected = (model(batch).softmax(1) + model(batch.flip(-1)).softmax(1).flip(-1)) / 2
    window = SlidingWindow(tile_size=32, tta="hflip", blend="none")
    got = probabilities(window, model, image)
    np.testing.assert_allclose(got, expected[0].numpy(), rtol=0, atol=1e-7)
    mirrored = probabilities(window, model, np.ascontiguousarray(image[:, ::-1]))
    np.testing.assert_allclose(mirrored, got[:, :, ::-1], atol=1e-6)


class _Sides(nn.Module):
    """A network that records the side of every batch it sees."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network
        self.sides: list[int] = []

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        self.sides.append(batch.shape[-1])
        return self.network(batch)


def test_scales_resize_each_tile_and_its_probabilities_back() -> None:
    model = _Sides(pointwise_model())
    # A smooth image: a pointwise network sees the same values at any scale.
    ramp = np.linspace(0, 1, 64, dtype=np.float32)
    rows, columns = np.meshgrid(ramp, ramp, indexing="ij")
    image = np.stack([rows * columns, rows, 1 - columns], axis=-1)
    window = SlidingWindow(
        tile_size=32, overlap=0.25, batch_size=9, tta="flip", tta_scales=[0.5, 1, 1.5]
    )
    assert len(list(window.tile_origins(64, 64))) == 9  # one batch
    got = probabilities(window, model, image)
    assert model.sides == [16] * 3 + [32] * 3 + [48] * 3  # 3 scales × 3 views
    assert got.shape == (CLASSES, 64, 64)
    np.testing.assert_allclose(got.sum(0), 1, atol=1e-5)
    plain = probabilities(SlidingWindow(tile_size=32, overlap=0.25), model.network, image)
    assert np.abs(got - plain).mean() < 0.01
    assert (got.argmax(0) == plain.argmax(0)).mean() > 0.97


def test_a_scaled_tile_is_padded_to_the_network_s_stride() -> None:
    """DeepLabV3+ takes multiples of 16: 32 × 1.25 = 40 goes in as 48, comes out as 40."""
    torch.manual_seed(0)
    network = smp.DeepLabV3Plus("resnet18", encoder_weights=None, classes=CLASSES).eval()
    model = _Sides(network)
    window = SlidingWindow(tile_size=32, tta="none", tta_scales=[1.25])
    labels = window.predict(model, random_image(32, 45), CLASSES)
    assert labels.shape == (32, 45) and model.sides == [48]  # one batch of 2 tiles


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tta": "D4"}, r"inference\.tta='D4' is not allowed"),
        ({"tta": "rotate"}, r"inference\.tta='rotate' is not allowed"),
        ({"tta": None}, r"inference\.tta=None is not allowed"),
        ({"tta": True}, r"inference\.tta=True is not allowed"),
        ({"tta_scales": []}, r"inference\.tta_scales=\[\] is not allowed"),
        ({"tta_scales": [0]}, r"inference\.tta_scales=\[0\] is not allowed: 0 is not"),
        ({"tta_scales": [1, -0.5]}, r"inference\.tta_scales=\[1, -0\.5\] is not allowed"),
        ({"tta_scales": [1, "1.25"]}, r"'1\.25' is not a number"),
        ({"tta_scales": [True]}, r"inference\.tta_scales=\[True\]"),
        ({"tta_scales": [float("nan")]}, r"inference\.tta_scales=\[nan\]"),
        ({"tta_scales": [float("inf")]}, r"inference\.tta_scales=\[inf\]"),
        ({"tta_scales": [5]}, r"inference\.tta_scales=\[5\].*in \(0, 4\]"),
        ({"tta_scales": 1.0}, r"inference\.tta_scales=1\.0 is not allowed"),
        ({"tta_scales": "1.0"}, r"inference\.tta_scales='1\.0' is not allowed"),
        ({"tta_scales": None}, r"inference\.tta_scales=None is not allowed"),
    ],
)
def test_bad_tta_values_name_the_key(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SlidingWindow(**kwargs)


def test_the_command_line_s_tta_reaches_the_window() -> None:
    cfg = compose_config("predict", "inference.tta=d4", "inference.tta_scales=[0.75,1,1.25]")
    window = instantiate(cfg.inference)
    assert (window.tta, window.tta_scales) == ("d4", (0.75, 1.0, 1.25))
    assert compose_config("evaluate").inference.tta == "none"
