import albumentations as A
import numpy as np
import pytest

from segscale.data.augment import Augmentation, PatchPose, cut_patch, patch_rng
from segscale.errors import ConfigError


def ramp(size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    ys, xs = np.mgrid[0:size, 0:size]
    image = np.stack([xs, ys, np.zeros_like(xs)], -1).astype(np.uint8)
    return image, (xs // 8 % 6).astype(np.uint8)


def test_unrotated_patch_is_a_plain_crop():
    image, mask = ramp()
    patch, labels = cut_patch(image, mask, PatchPose(30.0, 20.0, 0.0), 16, 255)
    np.testing.assert_array_equal(patch, image[12:28, 22:38])
    np.testing.assert_array_equal(labels, mask[12:28, 22:38])


def test_pixels_from_outside_the_image_are_ignored():
    image, mask = ramp()
    patch, labels = cut_patch(image, mask, PatchPose(4.0, 32.0, 0.0), 16, 255)
    assert (labels[:, :4] == 255).all()
    np.testing.assert_array_equal(patch[:, 4:], image[24:40, :12])
    assert (labels[:, 4:] != 255).all()
    # Rotated inside the image: no ignored corners.
    _, labels = cut_patch(image, mask, PatchPose(32.0, 32.0, 20.0), 16, 255)
    assert (labels != 255).all()


def test_transforms_are_reseeded_per_patch():
    flips = [A.HorizontalFlip(p=0.5), A.RandomBrightnessContrast(p=1.0)]
    augmentation = Augmentation(transforms=flips)
    image, mask = ramp()
    first = augmentation.transform(image, mask, patch_rng(0, 0, 5))[0]
    augmentation.transform(image, mask, patch_rng(0, 0, 6))  # an unrelated patch in between
    again = augmentation.transform(image, mask, patch_rng(0, 0, 5))[0]
    np.testing.assert_array_equal(first, again)
    outputs = {
        augmentation.transform(image, mask, patch_rng(0, 0, i))[0].tobytes() for i in range(8)
    }
    assert len(outputs) == 8


def test_a_scaled_patch_keeps_its_size_and_covers_side_over_scale_tile_pixels():
    image, mask = ramp()
    u = np.arange(16)
    # Scale 0.5 (the tile shrunk to half): 32 tile pixels a side, every second one.
    patch, labels = cut_patch(image, mask, PatchPose(32.5, 32.5, 0.0, 0.5), 16, 255)
    assert patch.shape == (16, 16, 3) and labels.shape == (16, 16)
    np.testing.assert_array_equal(patch[0, :, 0], 2 * u + 17)
    np.testing.assert_array_equal(labels, mask[17:49:2, 17:49:2])
    # Scale 2 (the tile doubled): 8 tile pixels a side, interpolated.
    patch, _ = cut_patch(image, mask, PatchPose(32.0, 32.0, 0.0, 2.0), 16, 255)
    assert np.abs(patch[0, :, 0] - (0.5 * u + 27.75)).max() <= 0.5


def test_scale_is_drawn_after_the_matlab_pose_and_only_when_asked_for():
    default, scaled = Augmentation(), Augmentation(scale=[0.5, 2.0])
    for index in range(20):
        before = default.pose(patch_rng(3, 0, index), 100.0, 100.0)
        after = scaled.pose(patch_rng(3, 0, index), 100.0, 100.0)
        assert before.scale == 1.0 and 0.5 <= after.scale <= 2.0
        assert (after.centre_x, after.centre_y, after.angle) == (
            before.centre_x,
            before.centre_y,
            before.angle,
        )


@pytest.mark.parametrize("scale", [[0, 2], [-1, 1], [2, 1]])
def test_a_scale_range_that_is_not_above_zero_and_ordered_is_refused(scale):
    with pytest.raises(ConfigError, match=r"datamodule\.augmentation\.scale=.* is not allowed"):
        Augmentation(scale=scale)
