import io
import logging

import pytest

from segscale import progress
from segscale.progress import Progress

log = logging.getLogger("tests.progress")


class _Clock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == log.name]


def test_redirected_a_long_pass_logs_a_line_per_tenth_with_counts_and_time_left(caplog):
    caplog.set_level("INFO")
    clock = _Clock()
    bar = Progress(200, "images evaluated", log, io.StringIO(), clock)
    for _ in range(200):
        clock.now += 1.0  # 1 s an image: 200 s in all
        bar.update()
    bar.close()
    lines = _lines(caplog)
    assert len(lines) == 10  # one per tenth, never one per image
    assert lines[0] == "images evaluated: 20/200 (10%), 00:20 so far, about 03:00 left"
    assert lines[-1] == "images evaluated: 200/200 (100%), 03:20 so far"


def test_a_slow_pass_logs_at_least_every_half_minute(caplog):
    caplog.set_level("INFO")
    clock = _Clock()
    bar = Progress(1000, "files checked", log, io.StringIO(), clock)
    for _ in range(30):
        clock.now += 10.0  # 10 s a file: a tenth would take 1000 s
        bar.update()
    assert [line.split(",")[0] for line in _lines(caplog)] == [
        "files checked: 3/1000 (0%)",
        "files checked: 6/1000 (0%)",
        "files checked: 9/1000 (0%)",
        "files checked: 12/1000 (1%)",
        "files checked: 15/1000 (1%)",
        "files checked: 18/1000 (1%)",
        "files checked: 21/1000 (2%)",
        "files checked: 24/1000 (2%)",
        "files checked: 27/1000 (2%)",
        "files checked: 30/1000 (3%)",
    ]


def test_a_pass_of_a_few_seconds_shows_nothing(caplog):
    caplog.set_level("INFO")
    clock = _Clock()
    bar = Progress(10, "images evaluated", log, io.StringIO(), clock)
    for _ in range(10):
        clock.now += progress.QUIET_S / 20
        bar.update()
    assert _lines(caplog) == []


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("logger", [log, None])
def test_on_a_terminal_it_is_a_bar_not_log_lines_and_without_a_log_neither(
    caplog, monkeypatch, logger
):
    caplog.set_level("INFO")
    monkeypatch.setattr(progress, "QUIET_S", 0.0)  # the bar at once
    clock, terminal = _Clock(), _Terminal()
    bar = Progress(5, "images evaluated", logger, terminal, clock)
    for _ in range(5):
        clock.now += 60.0
        bar.update()
    bar.close()
    assert _lines(caplog) == []
    assert ("images evaluated" in terminal.getvalue()) is (logger is not None)


def test_items_named_as_they_are_done_name_the_latest_in_the_lines(caplog):
    # bench's measurements: each named when done, a line per tenth names the latest.
    caplog.set_level("INFO")
    clock = _Clock()
    bar = Progress(10, "bench", log, io.StringIO(), clock)
    for item in ("pipeline", "compute", "gradients"):
        clock.now += 10.0
        bar(item)
    assert bar.done == 3 and bar.detail == "gradients"
    assert _lines(caplog)[-1] == "bench: 3/10 (30%), gradients, 00:30 so far, about 01:10 left"
