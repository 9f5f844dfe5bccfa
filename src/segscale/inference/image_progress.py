"""Progress of prediction and evaluation: images, the rows of tiles of the current one.

One large image can take a minute (2,149×1,479 pixels under ``inference.tta=d4``), so
the progress moves with its tiles, not only its end: ``segscale.progress.Progress``
counts the images, each a fraction at a time as its tiles are done (``OnTiles``), and
says the image, its row of tiles and the rate in its bar and lines. On a terminal that
is a bar; in a log a line every ``EVERY_S`` seconds or tenth of the images::

    images predicted: 0/1 (40%), image 1/1 (dubai.tif): row 4/9 of tiles, 5.2 tiles/s,
    00:12 so far, about 00:18 left

The time left assumes the images to come take as long as those done so far (the
current one by its tiles).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TextIO

from segscale.inference.sliding_window import OnTiles
from segscale.progress import Progress

EVERY_S = 10.0
"""The longest time between two progress lines in a log."""


class ImageProgress:
    """Progress through ``total`` images of ``what`` (``"images predicted"``).

    ``log``, ``stream``, ``clock`` as ``Progress`` takes them (``log`` None: nothing shown,
    another rank's share).
    """

    def __init__(
        self,
        total: int,
        what: str,
        log: logging.Logger | None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.progress = Progress(total, what, log, stream, clock, every_s=EVERY_S)
        self.tiles = 0  # every image's tiles done so far
        self.images = 0  # images begun
        self.image_tiles = 0  # the current image's tiles done
        self.fraction = 0.0  # of the current image, counted into the progress

    def image(self, name: str) -> OnTiles:
        """Begin the next image (``name`` for the lines); what its tiles report to."""
        self._finish_image()
        self.images += 1
        self.fraction, self.image_tiles = 0.0, 0
        label = f"image {self.images}/{self.progress.total} ({name})"

        def on_tiles(done: int, tiles: int, row: int, rows: int) -> None:
            self.tiles += done - self.image_tiles
            self.image_tiles = done
            seconds = self.progress.clock() - self.progress.start
            rate = f", {self.tiles / seconds:.1f} tiles/s" if seconds > 0 else ""
            self.progress.detail = f"{label}: row {row}/{rows} of tiles{rate}"
            fraction = done / tiles
            self.progress.update(fraction - self.fraction)
            self.fraction = fraction

        return on_tiles

    def image_done(self) -> None:
        """The current image is done (or left out): it counts whole."""
        self._finish_image()

    def _finish_image(self) -> None:
        if self.images and self.progress.done != self.images:
            self.progress.update(self.images - self.progress.done)  # whole: no rounding left

    def close(self) -> None:
        """Remove the bar (a log has had its lines)."""
        self.progress.close()
