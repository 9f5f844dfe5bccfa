import albumentations as A
import numpy as np

from segscale.data.augment import Augmentation, PatchPose, cut_patch, patch_rng


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
