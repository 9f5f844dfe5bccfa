import numpy as np
import pytest

from segscale.data.sampling.class_ratio import check_max_class_ratio, within_class_ratio
from segscale.errors import ConfigError


def mask_of(*counts: int, ignored: int = 0) -> np.ndarray:
    """A mask with ``counts[c]`` pixels of class ``c`` and ``ignored`` pixels of 255."""
    values = [np.full(n, c) for c, n in enumerate(counts)] + [np.full(ignored, 255)]
    return np.concatenate(values).astype(np.uint8).reshape(1, -1)


@pytest.mark.parametrize(
    ("mask", "ratio", "within"),
    [
        (mask_of(74, 26), 0.75, True),
        (mask_of(75, 25), 0.75, False),  # mmseg: the largest share must be below the ratio
        (mask_of(0, 29, 11, ignored=60), 0.75, True),  # ignored pixels do not count
        (mask_of(70, 10, ignored=20), 0.75, False),  # 70 of 80 labelled pixels
        (mask_of(100), 1.0, False),  # one class only: drawn again whatever the ratio
        (mask_of(ignored=100), 1.0, False),  # no labelled pixel
        (mask_of(99, 1), 1.0, True),
    ],
)
def test_the_largest_class_share_of_the_labelled_pixels_is_capped(mask, ratio, within):
    assert within_class_ratio(mask, 255, ratio) is within


@pytest.mark.parametrize("value", [0, 0.0, -0.5, 1.01, float("nan"), float("inf"), True, "0.75"])
def test_a_ratio_outside_zero_to_one_is_refused(value):
    with pytest.raises(ConfigError, match=r"datamodule\.sampling\.max_class_ratio=.* not allowed"):
        check_max_class_ratio(value)


@pytest.mark.parametrize(("value", "checked"), [(None, None), (0.75, 0.75), (1, 1.0)])
def test_null_or_a_share_in_zero_to_one_is_taken(value, checked):
    assert check_max_class_ratio(value) == checked
