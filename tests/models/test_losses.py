import itertools
import logging
import math
import re

import pytest
import torch
import torch.nn.functional as F
from segmentation_models_pytorch.losses import FocalLoss, LovaszLoss

from segscale import configs
from segscale.errors import ConfigError
from segscale.models.losses import SegmentationLoss, class_weights_from_frequencies
from segscale.runs.builders import build
from tests.conftest import compose_config
from tests.helpers.host_syncs import HostSyncCounter


def batch(images: int = 3, classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and a mask with an ignored border row."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(images, classes, 5, 6, generator=generator, dtype=torch.float64)
    mask = torch.randint(0, classes, (images, 5, 6), generator=generator)
    mask[:, 0] = 255
    return logits, mask


def test_the_default_is_cross_entropy_over_labelled_pixels():
    logits, mask = batch()
    terms = SegmentationLoss(3)(logits, mask)
    expected = F.cross_entropy(logits, mask, ignore_index=255)
    assert terms.mean().item() == pytest.approx(expected.item(), rel=1e-12)
    assert terms.counts.tolist() == [72, 72]
    assert SegmentationLoss(3).weights is None


def test_given_class_weights_give_pytorchs_weighted_mean():
    logits, mask = batch()
    weights = [0.5, 2.0, 1.0]
    loss = SegmentationLoss(3, class_weights=weights)
    expected = F.cross_entropy(
        logits, mask, weight=torch.tensor(weights, dtype=torch.float64), ignore_index=255
    )
    assert loss(logits, mask).mean().item() == pytest.approx(expected.item(), rel=1e-12)
    assert loss.weights.tolist() == weights


def test_inverse_weights_make_the_mean_pixel_weight_one():
    weights = class_weights_from_frequencies([0.5, 0.25, 0.25], "inverse")
    assert weights == pytest.approx([2 / 3, 4 / 3, 4 / 3])
    # Pixel counts are normalised to shares first.
    assert class_weights_from_frequencies([200, 100, 100], "inverse") == pytest.approx(weights)


def test_median_frequency_balancing():
    assert class_weights_from_frequencies([0.5, 0.25, 0.25], "median") == pytest.approx(
        [0.5, 1.0, 1.0]
    )
    # An even number of classes: the median is the mean of the middle two (0.25).
    assert class_weights_from_frequencies([0.4, 0.3, 0.2, 0.1], "median") == pytest.approx(
        [0.625, 0.25 / 0.3, 1.25, 2.5]
    )


@pytest.mark.parametrize(
    ("method", "expected"), [("inverse", [2 / 3, 4 / 3, 4 / 3, 0.0]), ("median", [0.5, 1, 1, 0])]
)
def test_a_class_that_never_occurs_gets_weight_zero(method, expected, caplog):
    with caplog.at_level(logging.WARNING):
        loss = SegmentationLoss(4, class_weights=method, class_frequencies=[0.5, 0.25, 0.25, 0])
    assert loss.weights.tolist() == pytest.approx(expected)
    assert "[3]" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["loss.cross_entropy=-1.0"], "loss.cross_entropy"),
        (["loss.dice=nan"], "loss.dice"),
        (["loss.focal=yes"], "loss.focal"),
        (["loss.lovasz=-1.0"], "loss.lovasz"),
        (["loss.label_smoothing=1.0"], "loss.label_smoothing"),
        (["loss.label_smoothing=-0.1"], "loss.label_smoothing"),
        (["loss.label_smoothing=nan"], "loss.label_smoothing"),
        (["loss=ohem", "loss.ohem_thresh=0.0"], "loss.ohem_thresh"),
        (["loss=ohem", "loss.ohem_thresh=1.0"], "loss.ohem_thresh"),
        (["loss=ohem", "loss.ohem_thresh='0.7'"], "loss.ohem_thresh"),
        (["loss=ohem", "loss.ohem_min_kept=-1"], "loss.ohem_min_kept"),
        (["loss=ohem", "loss.ohem_min_kept=1.5"], "loss.ohem_min_kept"),
        (["loss.focal=1.0", "loss.focal_gamma=-2.0"], "loss.focal_gamma"),
        (["loss.class_weights=sqrt"], "loss.class_weights='sqrt'"),
        (["loss.class_weights=[1.0,-2.0,1.0]"], "loss.class_weights"),
    ],
)
def test_bad_values_are_refused_as_the_config_is_composed_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=re.escape(key) + ".* is not allowed: expected"):
        configs.compose_config("train", overrides)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"cross_entropy": 0.0}, "loss.cross_entropy, loss.dice, loss.focal and loss.lovasz"),
        ({"class_weights": "inverse"}, "loss.class_weights=inverse needs"),
        ({"class_weights": [1.0, 2.0]}, "loss.class_weights"),
        ({"class_weights": [0, 0, 0]}, "loss.class_weights"),
        ({"class_weights": "median", "class_frequencies": [1, 1]}, "expected 3"),
        ({"class_weights": "median", "class_frequencies": [0, 0, 0]}, "loss.class_weights"),
        ({"class_weights": "median", "class_frequencies": [1, -1, 1]}, "loss.class_weights"),
        (
            {"cross_entropy": 0.0, "dice": 1.0, "class_weights": [1, 2, 3]},
            "loss.cross_entropy is 0",
        ),
    ],
)
def test_bad_settings_name_the_config_key(kwargs, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[")):
        SegmentationLoss(3, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cross_entropy": 0.0, "dice": 1.0},
        {"cross_entropy": 0.0, "focal": 1.0},
        {"cross_entropy": 1.0, "dice": 1.0, "focal": 0.5, "class_weights": [1.0, 3.0, 0.5]},
        {"cross_entropy": 0.0, "lovasz": 1.0},
        {"ohem_thresh": 0.7, "ohem_min_kept": 10, "label_smoothing": 0.1},
    ],
)
def test_each_loss_is_finite_and_falls_under_gradient_descent(kwargs):
    loss = SegmentationLoss(3, **kwargs)
    logits, mask = batch()
    logits.requires_grad_(True)
    optimizer = torch.optim.SGD([logits], lr=5.0)
    values = []
    for _ in range(5):
        optimizer.zero_grad()
        value = loss(logits, mask).mean()
        value.backward()
        optimizer.step()
        values.append(value.item())
    assert all(math.isfinite(v) for v in values)
    assert all(later < earlier for earlier, later in itertools.pairwise(values))


def test_only_switched_on_terms_are_computed():
    logits, mask = batch()
    terms = SegmentationLoss(3, cross_entropy=0.0, focal=1.0)(logits, mask)
    assert terms.sums[0].item() == 0 and terms.batch_term.item() == 0
    assert terms.sums[1].item() > 0


def test_ignored_pixels_change_no_term():
    loss = SegmentationLoss(3, dice=1.0, focal=1.0, class_weights=[1.0, 2.0, 0.5])
    logits, mask = batch()
    changed = logits.clone()
    changed[:, :, 0] = 100 * torch.randn_like(changed[:, :, 0])  # the ignored row
    before, after = loss(logits, mask), loss(changed, mask)
    assert torch.allclose(before.sums, after.sums, rtol=1e-12)
    assert before.batch_term.item() == pytest.approx(after.batch_term.item(), rel=1e-12)
    assert torch.equal(before.counts, after.counts)


@pytest.mark.parametrize("extra", [{}, {"lovasz": 1.0, "ohem_thresh": 0.7, "label_smoothing": 0.1}])
def test_a_batch_without_labelled_pixels_gives_zero_not_nan(extra):
    loss = SegmentationLoss(3, dice=1.0, focal=1.0, class_weights=[1.0, 2.0, 0.5], **extra)
    logits, mask = batch()
    logits.requires_grad_(True)
    value = loss(logits, torch.full_like(mask, 255)).mean()
    value.backward()
    assert value.item() == 0.0
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"class_weights": [1.0, 3.0, 0.5]},
        {"cross_entropy": 0.0, "focal": 1.0},
        {"cross_entropy": 0.7, "focal": 1.3, "class_weights": [1.0, 3.0, 0.5]},
    ],
)
def test_ranks_dividing_by_global_counts_average_to_the_whole_batch(kwargs):
    loss = SegmentationLoss(3, **kwargs)
    logits, mask = batch(images=3)
    mask[2, 1:3] = 255  # the halves differ in size and in labelled share
    halves = [loss(logits[:2], mask[:2]), loss(logits[2:], mask[2:])]
    global_counts = halves[0].counts + halves[1].counts
    # DDP averages what each of the 2 ranks returns.
    averaged = sum(h.mean(global_counts, scale=2) for h in halves) / 2
    whole = loss(logits, mask).mean()
    assert averaged.item() == pytest.approx(whole.item(), rel=1e-12)
    # The plain average of the halves' own means is not the whole batch's mean.
    assert (halves[0].mean() + halves[1].mean()).item() / 2 != pytest.approx(whole.item())


@pytest.mark.parametrize("gamma", [2.0, 0.0, 1.5])
def test_the_focal_term_is_smps_focal_loss(gamma):
    logits, mask = batch(classes=4)
    mask[1, 2:4] = 255
    expected = FocalLoss(mode="multiclass", gamma=gamma, ignore_index=255, reduction="sum")
    terms = SegmentationLoss(4, cross_entropy=0.0, focal=1.0, focal_gamma=gamma)(logits, mask)
    assert terms.sums[1].item() == pytest.approx(expected(logits, mask).item(), rel=1e-12)


@pytest.mark.parametrize("extra", [{}, {"ohem_thresh": 0.7, "label_smoothing": 0.1}])
def test_no_term_makes_the_host_wait_for_the_device(extra):
    # Boolean-mask selections (smp's focal loss, a weight lookup) would, on a GPU.
    loss = SegmentationLoss(3, dice=1.0, focal=1.0, class_weights=[1.0, 2.0, 0.5], **extra)
    logits, mask = batch()
    logits.requires_grad_(True)
    with HostSyncCounter() as counter:
        loss(logits, mask).mean().backward()
    assert counter.as_dict() == {}


@pytest.mark.parametrize("weights", [None, [0.5, 2.0, 1.0]])
def test_label_smoothing_is_torchs_with_ignored_pixels_and_class_weights(weights):
    logits, mask = batch()
    weight = None if weights is None else torch.tensor(weights, dtype=torch.float64)
    expected = F.cross_entropy(logits, mask, weight=weight, ignore_index=255, label_smoothing=0.2)
    loss = SegmentationLoss(3, label_smoothing=0.2, class_weights=weights)
    assert loss(logits, mask).mean().item() == pytest.approx(expected.item(), rel=1e-12)
    unsmoothed = F.cross_entropy(logits, mask, weight=weight, ignore_index=255)
    assert expected.item() != pytest.approx(unsmoothed.item())


def test_the_lovasz_term_is_smps_lovasz_loss_over_labelled_pixels():
    logits, mask = batch(classes=4)
    mask[1, 2:4] = 255
    # smp's Lovász works in float32 (it fails on float64 logits).
    expected = LovaszLoss(mode="multiclass", ignore_index=255)(logits.float(), mask)
    terms = SegmentationLoss(4, cross_entropy=0.0, lovasz=1.0)(logits, mask)
    assert terms.mean().item() == pytest.approx(expected.item(), rel=1e-6)
    both = SegmentationLoss(4, dice=1.0, lovasz=0.5)(logits, mask).mean()
    plain = SegmentationLoss(4, dice=1.0)(logits, mask).mean()
    assert both.item() == pytest.approx(plain.item() + 0.5 * expected.item(), rel=1e-6)


def test_ohem_keeps_the_pixels_below_the_threshold_and_the_hardest_few():
    # One image, four pixels, two classes: the true class's probabilities are
    # sigmoid(logit gap) = 0.9, 0.6, 0.3 and 0.8; the last pixel is ignored.
    gaps = torch.tensor([0.9, 0.6, 0.3, 0.8], dtype=torch.float64).logit()
    logits = torch.stack([gaps, torch.zeros(4, dtype=torch.float64)]).view(1, 2, 1, 4)
    mask = torch.tensor([[[0, 0, 0, 255]]])
    per_pixel = F.cross_entropy(logits, torch.zeros_like(mask), reduction="none").flatten()
    # thresh 0.7: the 0.6 and 0.3 pixels are hard; min_kept 1 adds none.
    terms = SegmentationLoss(2, ohem_thresh=0.7, ohem_min_kept=1)(logits, mask)
    assert terms.counts[0].item() == 2
    assert terms.mean().item() == pytest.approx(per_pixel[1:3].mean().item(), rel=1e-12)
    # thresh 0.5: only the 0.3 pixel is hard, but min_kept 2 keeps the 0.6 one too.
    terms = SegmentationLoss(2, ohem_thresh=0.5, ohem_min_kept=2)(logits, mask)
    assert terms.mean().item() == pytest.approx(per_pixel[1:3].mean().item(), rel=1e-12)
    # min_kept beyond the labelled pixels keeps them all, never the ignored one.
    terms = SegmentationLoss(2, ohem_thresh=0.5, ohem_min_kept=10)(logits, mask)
    assert terms.counts[0].item() == 3
    assert terms.mean().item() == pytest.approx(per_pixel[:3].mean().item(), rel=1e-12)


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("ohem", {"cross_entropy": 1.0, "lovasz": 0.0, "ohem_thresh": 0.7}),
        ("lovasz", {"cross_entropy": 0.0, "lovasz": 1.0, "ohem_thresh": None}),
        ("cross_entropy", {"cross_entropy": 1.0, "label_smoothing": 0.0, "ohem_thresh": None}),
    ],
)
def test_the_loss_presets_build(preset, expected):
    cfg = compose_config("train", f"loss={preset}", "output_dir=/tmp/x")
    loss = build(cfg.loss, num_classes=3, ignore_index=255, class_frequencies=[1, 1, 1])
    assert {key: getattr(loss, key) for key in expected} == expected
    logits, mask = batch()
    assert math.isfinite(loss(logits, mask).mean().item())
