import pytest
import torch

from segscale.errors import ConfigError
from segscale.training.reporting.scored_validations import (
    ScoredValidation,
    ScoredValidations,
    best_validation,
)


def _validation(step: int, score: float | None) -> ScoredValidation:
    return ScoredValidation(step, step // 4, score, torch.full((2, 2), step))


VALIDATIONS = [_validation(4, 0.5), _validation(8, 0.7), _validation(12, 0.7)]
VALIDATIONS += [_validation(16, float("nan")), _validation(20, None)]


def test_best_is_the_first_validation_of_the_best_score_as_best_ckpt_is_kept():
    # A tie does not replace the best; a NaN or missing score never wins.
    assert best_validation(VALIDATIONS, "max").step == 8
    assert best_validation(VALIDATIONS, "min").step == 4
    assert best_validation([_validation(4, None)], "max") is None


def _handed_over(network: str, final_step: int, mode: str = "max") -> tuple[int, str | None]:
    scores = ScoredValidations(network, "key")
    for v in VALIDATIONS:
        scores.record(v.step, v.epoch, v.score, v.confusion)
    chosen, checkpoint = scores.handed_over(mode, final_step)
    assert chosen is not None
    return chosen.step, checkpoint


def test_the_report_scores_the_network_the_run_hands_over():
    assert _handed_over("best-validation", 20) == (8, "best.ckpt")
    assert _handed_over("best-validation", 20, "min") == (4, "best.ckpt")
    # last-iteration: the last validation, last.ckpt's network if it validated at the end.
    assert _handed_over("last-iteration", 20) == (20, "last.ckpt")
    assert _handed_over("last-iteration", 24) == (20, None)
    # No score at all: the last validation.
    unscored = ScoredValidations("best-validation", "key")
    unscored.record(4, 0, None, torch.zeros(2, 2))
    assert unscored.handed_over("max", 4)[0].step == 4
    assert ScoredValidations("best-validation", "key").handed_over("max", 4) == (None, None)


def test_a_resume_keeps_the_validations_and_replaces_those_it_validates_again():
    scores = ScoredValidations("best-validation", "key")
    for v in VALIDATIONS[:3]:
        scores.record(v.step, v.epoch, v.score, v.confusion)
    resumed = ScoredValidations("best-validation", "key")
    resumed.load_state_dict(scores.state_dict())
    assert [v.step for v in resumed.validations] == [4, 8, 12]
    assert torch.equal(resumed.validations[1].confusion, VALIDATIONS[1].confusion)
    resumed.record(8, 1, 0.1, torch.zeros(2, 2))  # step 8 again: 8 and 12 are replaced
    assert [(v.step, v.score) for v in resumed.validations] == [(4, 0.5), (8, 0.1)]


def test_an_unknown_network_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"callbacks\.validation_report\.network='best'"):
        ScoredValidations("best", "callbacks.validation_report.network")
