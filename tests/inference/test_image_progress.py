import io
import logging
import re

import numpy as np
import pytest
from tqdm import tqdm

from segscale import progress
from segscale.inference import image_progress
from segscale.inference.image_progress import ImageProgress
from tests.conftest import oracle_checkpoint, oracle_image
from tests.inference.prediction.test_georeference import geotiff
from tests.inference.prediction.test_run import _predict

log = logging.getLogger("tests.image_progress")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == log.name]


def _two_images(bar: ImageProgress, clock: _Clock) -> None:
    """A large image (4 rows of 3 tiles, 3 tiles a batch), then a small one (1 tile)."""
    on_tiles = bar.image("a.tif")
    for row in range(1, 5):
        clock.now += 3.0  # 1 tile/s
        on_tiles(3 * row, 12, row, 4)
    bar.image_done()
    on_tiles = bar.image("b.png")
    clock.now += 1.0
    on_tiles(1, 1, 1, 1)
    bar.image_done()


def test_a_log_follows_the_rows_of_tiles_of_a_large_image_with_rate_and_time_left(
    caplog, monkeypatch
):
    caplog.set_level("INFO")
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    clock = _Clock()
    _two_images(ImageProgress(2, "images predicted", log, io.StringIO(), clock), clock)
    assert _lines(caplog) == [
        # a quarter of the first image: a tenth of the way and more
        "images predicted: 0/2 (12%), image 1/2 (a.tif): row 1/4 of tiles, 1.0 tiles/s, "
        "00:03 so far, about 00:21 left",
        "images predicted: 0/2 (25%), image 1/2 (a.tif): row 2/4 of tiles, 1.0 tiles/s, "
        "00:06 so far, about 00:18 left",
        "images predicted: 0/2 (37%), image 1/2 (a.tif): row 3/4 of tiles, 1.0 tiles/s, "
        "00:09 so far, about 00:15 left",
        "images predicted: 1/2 (50%), image 1/2 (a.tif): row 4/4 of tiles, 1.0 tiles/s, "
        "00:12 so far, about 00:12 left",
        "images predicted: 2/2 (100%), image 2/2 (b.png): row 1/1 of tiles, 1.0 tiles/s, "
        "00:13 so far",
    ]


def test_a_long_image_logs_every_ten_seconds_between_its_tenths(caplog, monkeypatch):
    caplog.set_level("INFO")
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    clock = _Clock()
    bar = ImageProgress(20, "images evaluated", log, io.StringIO(), clock)
    on_tiles = bar.image("big.tif")
    for done in range(1, 101):  # 100 tiles of 1 s: the whole image is a twentieth
        clock.now += 1.0
        on_tiles(done, 100, (done - 1) // 10 + 1, 10)
    times = [re.search(r"(\d\d:\d\d) so far", line).group(1) for line in _lines(caplog)]
    assert times == [tqdm.format_interval(s) for s in range(10, 100, 10)] + ["01:40"]
    assert image_progress.EVERY_S == 10.0


def test_a_terminal_shows_a_bar_and_the_log_stays_quiet(caplog, monkeypatch):
    caplog.set_level("INFO")
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    clock, terminal = _Clock(), _Terminal()
    bar = ImageProgress(2, "images predicted", log, terminal, clock)
    assert bar.progress.bar is not None
    _two_images(bar, clock)
    assert bar.progress.bar.n == 2
    assert bar.progress.bar.postfix == "image 2/2 (b.png): row 1/1 of tiles, 1.0 tiles/s"
    bar.close()
    assert not _lines(caplog)
    assert "images predicted" in terminal.getvalue()


def test_no_bar_where_stderr_is_no_terminal():
    assert ImageProgress(2, "images predicted", log, io.StringIO()).progress.bar is None
    assert ImageProgress(2, "images predicted", None, _Terminal()).progress.bar is None


@pytest.mark.parametrize("tta", ["none", "d4"])
def test_a_tiny_prediction_logs_its_images_and_rows_of_tiles(tta, tmp_path, caplog, monkeypatch):
    caplog.set_level("INFO", logger="segscale.inference.prediction.run")
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    monkeypatch.setattr(image_progress, "EVERY_S", 0.0)  # a line at every batch
    root = tmp_path / "scene"

    (root / "in").mkdir(parents=True)
    truth = np.random.default_rng(5).integers(0, 3, (70, 90)).astype(np.uint8)
    geotiff(root / "in" / "scene.tif", oracle_image(truth))
    ckpt = oracle_checkpoint(root / "oracle.ckpt")
    _predict(ckpt, root / "in", tmp_path / "out", f"inference.tta={tta}", "inference.batch_size=4")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("images")]
    # 70×90 pixels in 32-pixel tiles at stride 24: 3 rows of 4 tiles, 4 a batch.
    pattern = (
        r"images predicted: {done}/1 \({percent}%\), image 1/1 \(scene\.tif\): "
        r"row {row}/3 of tiles, [0-9.]+ tiles/s, [0-9:]+ so far{left}"
    )
    expected = [
        pattern.format(done=0, percent=33, row=1, left=", about [0-9:]+ left"),
        pattern.format(done=0, percent=66, row=2, left=", about [0-9:]+ left"),
        pattern.format(done=1, percent=100, row=3, left=""),
    ]
    assert len(lines) == 3
    for line, wanted in zip(lines, expected, strict=True):
        assert re.fullmatch(wanted, line), line
