import logging

from segscale.training.callbacks.verbose_log import VerboseLog
from segscale.training.run import train

# The tiny config trains 2 epochs of 4 iterations each (see tests/conftest.py).


def test_verbose_log_prints_every_n_iterations(make_config, caplog):
    caplog.set_level(logging.INFO, logger="segscale.training.callbacks")
    train(make_config("callbacks.verbose_log.frequency=3"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("|")]
    assert lines[0] == VerboseLog.HEADER
    iterations = [int(line.split("|")[2]) for line in lines[1:]]
    # Iteration 1, every 3rd iteration, and a row with the validation columns after each
    # epoch's validation (iterations 4 and 8).
    assert iterations == [1, 3, 4, 6, 8]
    validation_rows = [line for line in lines[1:] if line.split("|")[5].strip()]
    assert [int(r.split("|")[2]) for r in validation_rows] == [4, 8]
    assert all(len(line.split("|")) == 10 for line in lines)
