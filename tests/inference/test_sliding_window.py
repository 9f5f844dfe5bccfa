from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from segscale.configs import CONFIG_DIR
from segscale.errors import ConfigError
from segscale.inference.sliding_window import SlidingWindow, gaussian_window, tile_starts

CLASSES = 4


def pointwise_model(channels: int = 3, scale: float = 1.0) -> nn.Module:
    """A 1×1 conv: every pixel's logits depend on that pixel only, so tiling is exact."""
    torch.manual_seed(0)
    conv = nn.Conv2d(channels, CLASSES, 1)
    return nn.Sequential(_Scale(scale), conv).eval()


def context_model() -> nn.Module:
    """Two 3×3 convs with zero padding: tile borders see different context."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, CLASSES, 3, padding=1)
    ).eval()


class _Scale(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def full_probabilities(model: nn.Module, image: np.ndarray) -> np.ndarray:
    image = image[:, :, None] if image.ndim == 2 else image
    with torch.inference_mode():
        batch = torch.from_numpy(image.astype(np.float32)).permute(2, 0, 1)[None]
        return model(batch).softmax(1)[0].numpy()


def random_image(height: int, width: int, channels: int = 3) -> np.ndarray:
    return np.random.default_rng(0).random((height, width, channels), dtype=np.float32)


@pytest.mark.parametrize("tta", ["none", "hflip", "flip", "d4"])
def test_pointwise_model_matches_full_image(tta: str) -> None:
    model, image = pointwise_model(), random_image(70, 45)
    window = SlidingWindow(tile_size=32, overlap=0.25, batch_size=3, tta=tta)
    labels = window.predict(model, image, CLASSES)
    assert labels.shape == (70, 45) and labels.dtype == np.uint8
    np.testing.assert_array_equal(labels, full_probabilities(model, image).argmax(0))


def test_context_model_close_to_full_image() -> None:
    model, image = context_model(), random_image(70, 45)
    window = SlidingWindow(tile_size=32, overlap=0.25, batch_size=4)
    bands = [p for _, p in window.probability_bands(model, image, CLASSES)]
    blended, full = np.concatenate(bands, axis=1), full_probabilities(model, image)
    np.testing.assert_allclose(blended.sum(0), 1, atol=1e-5)
    assert np.abs(blended - full).mean() < 1e-3
    assert np.abs(blended - full).max() < 0.05
    labels = window.predict(model, image, CLASSES)
    assert (labels == full.argmax(0)).mean() >= 0.99


@pytest.mark.parametrize("shape", [(20, 45), (70, 12), (10, 12), (1, 40), (40, 1)])
def test_image_smaller_than_tile(shape: tuple[int, int]) -> None:
    model, image = pointwise_model(), random_image(*shape)
    labels = SlidingWindow(tile_size=32).predict(model, image, CLASSES)
    np.testing.assert_array_equal(labels, full_probabilities(model, image).argmax(0))


def test_single_channel_image() -> None:
    model, image = pointwise_model(channels=1), random_image(50, 37, channels=1)[:, :, 0]
    window = SlidingWindow(tile_size=16, overlap=0.5)
    labels = window.predict(model, image, CLASSES)
    np.testing.assert_array_equal(labels, full_probabilities(model, image).argmax(0))
    np.testing.assert_array_equal(labels, window.predict(model, image[:, :, None], CLASSES))


def test_uint16_image() -> None:
    image = np.random.default_rng(1).integers(0, 65535, (40, 33, 3), dtype=np.uint16)
    model = pointwise_model(scale=1 / 65535)
    labels = SlidingWindow(tile_size=16).predict(model, image, CLASSES)
    np.testing.assert_array_equal(labels, full_probabilities(model, image).argmax(0))


def test_read_only_memmap(tmp_path: Path) -> None:
    image = np.random.default_rng(2).integers(0, 255, (45, 70, 3), dtype=np.uint8)
    np.save(tmp_path / "image.npy", image)
    mapped = np.load(tmp_path / "image.npy", mmap_mode="r")
    model, window = pointwise_model(scale=1 / 255), SlidingWindow(tile_size=32)
    labels = window.predict(model, mapped, CLASSES)
    np.testing.assert_array_equal(labels, window.predict(model, image, CLASSES))
    np.testing.assert_array_equal(labels, full_probabilities(model, image).argmax(0))


def test_bands_in_order_cover_every_row_once() -> None:
    model, image = context_model(), random_image(70, 45)
    window = SlidingWindow(tile_size=16, overlap=0.25, batch_size=5)
    bands: list[tuple[int, np.ndarray]] = []
    assert window.predict(model, image, CLASSES, on_band=lambda y, b: bands.append((y, b))) is None
    starts = [y for y, _ in bands]
    assert starts[0] == 0 and len(bands) > 2
    for (y, band), next_start in zip(bands, [*starts[1:], 70], strict=True):
        assert band.shape == (next_start - y, 45) and band.dtype == np.uint8
    np.testing.assert_array_equal(
        np.concatenate([b for _, b in bands]), window.predict(model, image, CLASSES)
    )


def test_many_classes_give_uint16_labels() -> None:
    torch.manual_seed(0)
    model = nn.Conv2d(3, 300, 1).eval()
    labels = SlidingWindow(tile_size=16).predict(model, random_image(20, 20), 300)
    assert labels.dtype == np.uint16
    np.testing.assert_array_equal(labels, full_probabilities(model, random_image(20, 20)).argmax(0))


def test_peak_memory_does_not_grow_with_height(tmp_path: Path) -> None:
    model, window = pointwise_model(), SlidingWindow(tile_size=32, overlap=0.25, batch_size=4)

    def peak(height: int) -> int:
        path = tmp_path / f"{height}.npy"
        np.save(path, random_image(height, 256))
        image = np.load(path, mmap_mode="r")  # mapped pages are not traced
        tracemalloc.reset_peak()
        window.predict(model, image, CLASSES, on_band=lambda y, band: None)
        return tracemalloc.get_traced_memory()[1]

    tracemalloc.start()
    try:
        peak(64)  # warm-up: lazy one-off allocations
        short, tall = peak(64), peak(256)
    finally:
        tracemalloc.stop()
    assert tall < 1.5 * short


def test_model_with_wrong_class_count_is_reported() -> None:
    with pytest.raises(ValueError, match="num_classes=5"):
        SlidingWindow(tile_size=16).predict(pointwise_model(), random_image(20, 20), 5)


def test_tile_starts_end_at_the_border() -> None:
    assert tile_starts(70, 32, 24) == [0, 24, 38]
    assert tile_starts(64, 32, 32) == [0, 32]
    assert tile_starts(20, 32, 24) == [0]


def test_window_is_positive_and_peaks_at_centre() -> None:
    window = gaussian_window(32, 20)
    assert window.shape == (32, 20) and window.dtype == np.float32
    assert window.min() > 0 and window.max() <= 1
    assert window[15:17, 9:11].min() == window.max()


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"tile_size": 0}, "inference.tile_size"),
        ({"tile_size": 32.5}, "inference.tile_size"),
        ({"overlap": 1.0}, "inference.overlap"),
        ({"overlap": -0.1}, "inference.overlap"),
        ({"batch_size": 0}, "inference.batch_size"),
        ({"tta": "yes"}, "inference.tta"),
    ],
)
def test_bad_values_name_the_key(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        SlidingWindow(**kwargs)


def test_default_config_instantiates() -> None:
    window = instantiate(OmegaConf.load(Path(CONFIG_DIR) / "inference" / "default.yaml"))
    assert isinstance(window, SlidingWindow)
    assert (window.tile_size, window.stride, window.batch_size) == (512, 384, 8)
    assert (window.tta, window.tta_scales) == ("none", (1.0,))


@pytest.mark.parametrize("shape", [(64, 64), (70, 45), (33, 100)])
def test_blend_none_without_overlap_predicts_as_the_validation_grid(shape) -> None:
    """evaluate.py's default inference is training's validation: pixel for pixel."""
    from segscale.data.sampling.patches import GridPatchDataset, grid_inference
    from segscale.data.storage.tiles import Tile
    from segscale.training.reporting.whole_tile_prediction import predict_whole_tile

    model = context_model()  # tile borders matter: the tiling must be the same one
    image = (random_image(*shape) * 255).astype(np.uint8)
    grid = GridPatchDataset([Tile(image, np.zeros(shape, np.uint8))], patch_size=16)

    def classify(images: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model(images.float()).argmax(1)

    expected = predict_whole_tile(classify, grid, 0)
    window = SlidingWindow(**grid_inference(16), batch_size=5)
    assert np.array_equal(window.predict(model, image, CLASSES), expected)
    # predict.py's Gaussian blend of the same tiles is another prediction
    blended = SlidingWindow(tile_size=16, overlap=0.0).predict(model, image, CLASSES)
    assert not np.array_equal(blended, expected) or shape == (64, 64)


def test_an_unknown_blend_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"inference\.blend='mean' is not allowed"):
        SlidingWindow(blend="mean")
