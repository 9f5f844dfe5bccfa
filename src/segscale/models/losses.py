"""The training loss: cross-entropy, Dice, focal and Lovász terms, with class weights.

The cross-entropy term may smooth its labels (``label_smoothing``) and may keep only the
hardest pixels (``ohem_thresh``, mmseg's online hard example mining).

A loss is returned as its parts (``LossTerms``) rather than one number, so that the
module can divide the pixel terms by the labelled pixels of the *global* batch under DDP.
"""

from __future__ import annotations

import logging
import math
import numbers
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from segmentation_models_pytorch.losses import DiceLoss, LovaszLoss
from torch import nn

from segscale.config_schema import WEIGHT_METHODS
from segscale.errors import ConfigError

log = logging.getLogger(__name__)


def _is_number(value: Any) -> bool:
    # numbers.Real also takes numpy scalars, as frequencies counted with numpy are.
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def class_weights_from_frequencies(frequencies: Sequence[float], method: str) -> list[float]:
    """Class weights that balance the classes' pixel shares ``frequencies``.

    ``inverse``: w_c ∝ 1/f_c, scaled so that the pixel-weighted mean weight Σ f_c·w_c is 1
    (the loss keeps the scale of the unweighted one). ``median``: median frequency
    balancing (Eigen & Fergus 2015), w_c = median(f)/f_c over the classes that occur.
    ``frequencies`` may be pixel counts; they are normalised to shares. A class with
    frequency 0 never occurs in the training set and gets weight 0.
    """
    values = list(frequencies)
    if not values or not all(_is_number(f) and f >= 0 for f in values) or sum(values) <= 0:
        raise ConfigError(
            f"loss.class_weights={method} needs class pixel frequencies that are finite, "
            f">= 0 and not all 0; got {values}"
        )
    total = sum(values)
    shares = [f / total for f in values]
    present = [f for f in shares if f > 0]
    absent = [c for c, f in enumerate(shares) if f == 0]
    if absent:
        log.warning(
            "classes %s have no pixels in the training set; loss.class_weights=%s gives them "
            "weight 0",
            absent,
            method,
        )
    scale = 1 / len(present) if method == "inverse" else statistics.median(present)
    return [scale / f if f > 0 else 0.0 for f in shares]


def _resolve_class_weights(
    class_weights: str | Sequence[float] | None,
    class_frequencies: Sequence[float] | None,
    num_classes: int,
) -> list[float] | None:
    if class_weights is None:
        return None
    if isinstance(class_weights, str):
        if class_weights in WEIGHT_METHODS and class_frequencies is None:
            raise ConfigError(
                f"loss.class_weights={class_weights} needs the training set's class "
                "frequencies, but none were given; use a list of weights or null instead"
            )
        weights = class_weights_from_frequencies(
            [] if class_frequencies is None else class_frequencies, class_weights
        )
        if len(weights) != num_classes:
            raise ConfigError(
                f"loss.class_weights={class_weights}: got {len(weights)} class frequencies, "
                f"expected {num_classes} (one per class)"
            )
        return weights
    weights = list(class_weights)
    if len(weights) != num_classes:  # each weight's kind and range: the schema's
        raise ConfigError(
            f"loss.class_weights={weights} must list {num_classes} finite weights >= 0, "
            "one per class"
        )
    if sum(weights) <= 0:
        raise ConfigError(f"loss.class_weights={weights}: at least one weight must be > 0")
    return [float(w) for w in weights]


@dataclass
class LossTerms:
    """One batch's loss in parts: pixel sums with their normalisers, and a per-batch term.

    ``sums`` holds the (class-weighted) cross-entropy sum and the focal sum over the
    labelled pixels, ``counts`` their normalisers (the summed class weights of the
    labelled pixels, or their count when unweighted; and the labelled count).
    ``batch_term`` is the weighted Dice and Lovász losses, which are not sums over pixels.
    """

    sums: torch.Tensor
    counts: torch.Tensor
    batch_term: torch.Tensor
    cross_entropy: float
    focal: float
    dice: float
    lovasz: float = 0.0

    def mean(self, counts: torch.Tensor | None = None, scale: float = 1) -> torch.Tensor:
        """The loss, ``Σ weight·scale·sum/count`` over the pixel terms plus ``batch_term``.

        ``counts`` replaces this batch's normalisers (e.g. by the global batch's under
        DDP); ``scale`` multiplies the pixel sums first, so that a DDP objective keeps the
        exact arithmetic of a plain ``sum * world_size / count``.
        """
        counts = self.counts if counts is None else counts
        # A batch without labelled pixels has zero sums: 0/eps is 0, where 0/0 is NaN.
        counts = counts.clamp(min=1e-12).to(self.sums.dtype)
        parts = [
            weight * (scale * self.sums[i]) / counts[i]
            for i, weight in enumerate((self.cross_entropy, self.focal))
            if weight > 0
        ]
        if self.dice > 0 or self.lovasz > 0:
            parts.append(self.batch_term)
        return sum(parts[1:], parts[0])


class SegmentationLoss(nn.Module):
    """Cross-entropy, Dice, focal and Lovász loss, each with a weight (0 switches it off).

    ``class_weights`` weights the cross-entropy term per class: a list with one weight
    per class, or ``inverse`` / ``median`` computed from ``class_frequencies`` (the
    classes' pixel shares in the training set, given by the caller). Dice and focal are
    segmentation_models_pytorch's multiclass losses; focal is its one-vs-rest sigmoid
    focal loss (averaged over the classes' terms by smp 0.6; older releases summed them),
    here a mean over labelled pixels. Lovász is smp's multiclass ``LovaszLoss`` (the
    Lovász-softmax over the batch's labelled pixels and the classes present). Pixels
    labelled ``ignore_index`` count in no term.

    ``label_smoothing`` (in [0, 1)) is torch's: the cross-entropy target puts that share
    of its mass uniformly over the classes. ``ohem_thresh`` (in (0, 1), or ``None``: off)
    keeps in the cross-entropy term only the hard pixels, as mmseg's ``OHEMPixelSampler``:
    those whose predicted probability of their true class is below ``ohem_thresh``, and
    at least the ``ohem_min_kept`` hardest labelled pixels of the batch when fewer are.
    """

    weights: torch.Tensor | None  # a buffer: the class weights, or None for unweighted

    def __init__(
        self,
        num_classes: int,
        ignore_index: int = 255,
        cross_entropy: float = 1.0,
        dice: float = 0.0,
        focal: float = 0.0,
        focal_gamma: float = 2.0,
        class_weights: str | Sequence[float] | None = None,
        class_frequencies: Sequence[float] | None = None,
        lovasz: float = 0.0,
        label_smoothing: float = 0.0,
        ohem_thresh: float | None = None,
        ohem_min_kept: int = 100_000,
    ) -> None:
        super().__init__()
        # Each value's kind and range is the schema's (segscale.config_schema); here the
        # rules across keys.
        terms = {"cross_entropy": cross_entropy, "dice": dice, "focal": focal, "lovasz": lovasz}
        if not any(weight > 0 for weight in terms.values()):
            raise ConfigError(
                "loss.cross_entropy, loss.dice, loss.focal and loss.lovasz are all 0; "
                "at least one term weight must be > 0"
            )
        weights = _resolve_class_weights(class_weights, class_frequencies, num_classes)
        if weights is not None and cross_entropy == 0:
            # Silently training unweighted would hide the mistake.
            raise ConfigError(
                f"loss.class_weights={class_weights} weights the cross-entropy term only, "
                "but loss.cross_entropy is 0; set loss.cross_entropy > 0 or "
                "loss.class_weights=null"
            )
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.cross_entropy = float(cross_entropy)
        self.dice = float(dice)
        self.focal = float(focal)
        # Not persistent: the weights follow from the config and the data, and a
        # checkpoint should load into a module built with another loss.
        self.register_buffer(
            "weights", None if weights is None else torch.tensor(weights), persistent=False
        )
        self.focal_gamma = float(focal_gamma)
        self.dice_loss = DiceLoss(mode="multiclass", ignore_index=ignore_index, from_logits=True)
        self.lovasz = float(lovasz)
        self.lovasz_loss = LovaszLoss(mode="multiclass", ignore_index=ignore_index)
        self.label_smoothing = float(label_smoothing)
        self.ohem_thresh = None if ohem_thresh is None else float(ohem_thresh)
        self.ohem_min_kept = int(ohem_min_kept)

    def _weight_sum(
        self, mask: torch.Tensor, labelled: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """The summed class weights of the labelled pixels (the weighted normaliser).

        A lookup by class index over every pixel, zeroed where ignored: selecting the
        labelled pixels first (``mask[labelled]``) would make the host wait for the
        device to count them.
        """
        weights = self.weights
        assert weights is not None  # forward calls this only for weighted cross-entropy
        classes = torch.where(labelled, mask, 0)  # ignore_index is no class: look up 0
        return torch.where(labelled, weights.to(dtype)[classes], 0).sum()

    def _focal_sum(
        self, logits: torch.Tensor, mask: torch.Tensor, labelled: torch.Tensor
    ) -> torch.Tensor:
        """The focal term as smp's multiclass ``FocalLoss(reduction="sum")``, term for term.

        One-vs-rest sigmoid focal terms ``(1 - p_t)^γ · BCE`` summed over the labelled
        pixels of each class, averaged over the classes (as smp 0.6 does). smp selects
        the labelled pixels with boolean masks, twice per class (a host sync each, and
        one more per class in the backward pass); here every pixel gets its terms and
        the ignored ones are zeroed.
        """
        shape = [1, logits.size(1)] + [1] * (logits.dim() - 2)
        classes = torch.arange(logits.size(1), device=logits.device).view(shape)
        target = (mask.unsqueeze(1) == classes).to(logits.dtype)
        cross_entropy = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        terms = (1.0 - torch.exp(-cross_entropy)).pow(self.focal_gamma) * cross_entropy
        return torch.where(labelled.unsqueeze(1), terms, 0).sum() / logits.size(1)

    def _hard_pixels(self, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The labelled pixels OHEM keeps: the hard ones, and at least the hardest few.

        As mmseg's ``OHEMPixelSampler`` with ``thresh``: a pixel is hard when the
        predicted probability of its true class is below ``ohem_thresh``; the
        ``ohem_min_kept`` labelled pixels of lowest such probability are kept whatever it
        is (all labelled pixels, in a batch with fewer). No gradient flows through the
        choice. Ignored pixels get probability infinity, so they are never among the
        hardest, and no host sync is needed to count the labelled ones.
        """
        assert self.ohem_thresh is not None  # forward calls this only with OHEM on
        labelled = mask != self.ignore_index
        with torch.no_grad():
            probabilities = logits.detach().float().softmax(dim=1)
            classes = torch.where(labelled, mask, 0).unsqueeze(1)
            truth = probabilities.gather(1, classes).squeeze(1)
            truth = torch.where(labelled, truth, torch.inf)
            hard = truth < self.ohem_thresh
            if self.ohem_min_kept > 0:
                k = min(self.ohem_min_kept, truth.numel())
                hard |= truth <= truth.flatten().kthvalue(k).values
            return labelled & hard

    def forward(self, logits: torch.Tensor, mask: torch.Tensor) -> LossTerms:
        """The terms of the loss of ``logits`` (N×C×H×W) against ``mask`` (N×H×W)."""
        labelled = mask != self.ignore_index
        # At least float32 (autocast may give float16 logits). Counts in float64 stay exact
        # integers past 2**24 pixels; MPS has no float64.
        dtype = torch.promote_types(logits.dtype, torch.float32)
        count_dtype = torch.float32 if logits.device.type == "mps" else torch.float64
        zero = logits.new_zeros((), dtype=dtype)
        labelled_count = labelled.sum().to(count_dtype)
        ce_sum, ce_count, focal_sum, dice_term = zero, zero.to(count_dtype), zero, zero
        if self.cross_entropy > 0:
            # cross_entropy wants the weights in the logits' type (autocast then casts both).
            weight = None if self.weights is None else self.weights.to(logits.dtype)
            kept = labelled if self.ohem_thresh is None else self._hard_pixels(logits, mask)
            # Without OHEM, torch's own sum: the default objective stays what it was to
            # the last bit (a masked sum of per-pixel terms adds in another order).
            ce_sum = F.cross_entropy(
                logits,
                mask if self.ohem_thresh is None else torch.where(kept, mask, self.ignore_index),
                weight=weight,
                ignore_index=self.ignore_index,
                reduction="sum",
                label_smoothing=self.label_smoothing,
            ).to(dtype)
            ce_count = (
                (labelled_count if self.ohem_thresh is None else kept.sum().to(count_dtype))
                if self.weights is None
                else self._weight_sum(mask, kept, count_dtype)
            )
        if self.focal > 0:
            focal_sum = self._focal_sum(logits, mask, labelled).to(dtype)
        if self.dice > 0:
            dice_term = self.dice * self.dice_loss(logits, mask)
        if self.lovasz > 0:
            # In float32: smp's Lovász mixes the logits' type with float32 (fails in float64,
            # loses precision in float16). A batch without labelled pixels gets an empty
            # tensor from smp: .sum() makes it 0.
            lovasz = self.lovasz_loss(logits.float(), mask).sum()
            dice_term = dice_term + self.lovasz * lovasz.to(dtype)
        return LossTerms(
            sums=torch.stack([ce_sum, focal_sum]),
            counts=torch.stack([ce_count, labelled_count]),
            batch_term=dice_term,
            cross_entropy=self.cross_entropy,
            focal=self.focal,
            dice=self.dice,
            lovasz=self.lovasz,
        )
