import logging

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.models.nonfinite import EXIT_NONFINITE, NonFiniteError
from segscale.sweeps.failed_jobs import (
    FailedJob,
    JobFailedError,
    end_with_failures,
    failed_jobs,
)


def job(overrides: list[str], outcome: object, folder: str | None = None) -> JobReturn:
    """A job's result as Hydra's launchers give it: a value, or the exception it raised."""
    hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": folder}}})
    result = JobReturn(overrides=overrides, hydra_cfg=hydra_cfg if folder else None)
    failed = isinstance(outcome, BaseException)
    result.status = JobStatus.FAILED if failed else JobStatus.COMPLETED
    result.return_value = outcome
    return result


def test_expected_failures_are_named_with_what_set_their_job_apart():
    results = [
        job(["a=1", "lr=0.1"], 0.5, "/s/3"),
        job(["a=1", "lr=9"], NonFiniteError("training stopped: the loss is not finite"), "/s/4"),
        job(["a=1", "lr=-1"], ConfigError("optimizer.lr=-1 is not allowed\n  more"), "/s/5"),
        job(["a=1", "lr=8"], JobFailedError("job 6 failed with exit code 3; see c.log", 3)),
    ]
    assert failed_jobs(results, first_number=3) == [
        FailedJob(4, ("lr=9",), "/s/4", "training stopped: the loss is not finite", 3),
        FailedJob(5, ("lr=-1",), "/s/5", "optimizer.lr=-1 is not allowed", EXIT_BAD_INPUT),
        FailedJob(6, ("lr=8",), None, "job 6 failed with exit code 3; see c.log", 3),
    ]


def test_a_crash_is_raised_as_hydra_s_sweeper_raises_it(capsys):
    results = [job(["lr=1"], ConfigError("refused")), job(["lr=2"], KeyError("bug"))]
    with pytest.raises(KeyError, match="bug"):
        failed_jobs(results)
    assert "Error executing job with overrides: ['lr=2']" in capsys.readouterr().err


def test_the_sweep_ends_with_a_line_per_failed_job_and_the_first_one_s_status(caplog):
    failed = [
        FailedJob(0, ("lr=9",), "/s/0", "the loss is not finite", EXIT_NONFINITE),
        FailedJob(2, (), None, "refused", EXIT_BAD_INPUT),
    ]
    caplog.set_level(logging.ERROR)
    with pytest.raises(SystemExit) as stop:
        end_with_failures(failed, jobs=3)
    assert stop.value.code == EXIT_NONFINITE
    assert caplog.messages == [
        "2 of 3 job(s) of the sweep failed:\n"
        "  #0 (lr=9, /s/0): the loss is not finite\n"
        "  #2: refused"
    ]
    end_with_failures([], jobs=3)  # none failed: the sweep ends as it would
