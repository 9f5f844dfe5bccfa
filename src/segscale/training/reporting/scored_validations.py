"""Which validation scored the network a run hands over (``training.output_network``).

A run's evaluation report is the confusion matrix of one validation. With the default
``best-validation`` the run hands over ``best.ckpt``, so the report must be the
validation that made it best, not the last one. ``ScoredValidations`` keeps each
validation's step, epoch, monitored score and confusion matrix (a few numbers per
class), across a resume, and picks the one of the handed-over network as Lightning's
``ModelCheckpoint`` picks ``best.ckpt``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from segscale.errors import ConfigError

NETWORKS = ("best-validation", "last-iteration")
"""The networks a run can hand over (``training.output_network``)."""


class ScoredValidation(NamedTuple):
    """One validation: its step and epoch, the monitored score, its confusion matrix."""

    step: int
    epoch: int
    score: float | None
    confusion: torch.Tensor


def best_validation(validations: list[ScoredValidation], mode: str) -> ScoredValidation | None:
    """The first validation of the best score (``mode`` max or min), as best.ckpt is kept.

    A later validation replaces the best only with a strictly better score, and a NaN
    or missing score never wins (``ModelCheckpoint`` with ``save_top_k=1``).
    """
    best: ScoredValidation | None = None
    best_score = math.nan
    for validation in validations:
        score = validation.score
        if score is None or math.isnan(score):
            continue
        better = score > best_score if mode == "max" else score < best_score
        if best is None or better:
            best, best_score = validation, score
    return best


class ScoredValidations:
    """The validations of a run, and the one of the network it hands over (``network``)."""

    def __init__(self, network: str, key: str) -> None:
        if network not in NETWORKS:
            raise ConfigError(
                f"{key}={network!r}: expected one of {', '.join(NETWORKS)} "
                "(training.output_network's values)"
            )
        self.network = network
        self.validations: list[ScoredValidation] = []

    def record(self, step: int, epoch: int, score: float | None, confusion: torch.Tensor) -> None:
        """Keep one validation (a resume that validates a step again replaces it and after)."""
        self.validations = [v for v in self.validations if v.step < step]
        self.validations.append(ScoredValidation(step, epoch, score, confusion.clone().cpu()))

    def handed_over(self, mode: str, final_step: int) -> tuple[ScoredValidation | None, str | None]:
        """The validation of the network the run hands over, and that network's checkpoint.

        ``best-validation``: the first validation of the best score (``mode``: the
        checkpoint callback's), ``best.ckpt``; if no validation has a score, the last.
        ``last-iteration``: the last validation, ``last.ckpt``'s network if it validated at
        ``final_step`` (else no checkpoint holds the network it scored: ``None``).
        """
        if not self.validations:
            return None, None
        if self.network == "best-validation":
            best = best_validation(self.validations, mode)
            if best is not None:
                return best, "best.ckpt"
        last = self.validations[-1]
        return last, "last.ckpt" if last.step == final_step else None

    def state_dict(self) -> dict[str, Any]:
        """The validations so far (numbers and small tensors: a checkpoint's callback state)."""
        return {"validations": [v._asdict() for v in self.validations]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the validations of the run a resume continues."""
        self.validations = [ScoredValidation(**v) for v in state_dict.get("validations", [])]
