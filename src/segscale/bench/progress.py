"""bench's progress bar."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    """The progress bar: one tick per measurement, the latest one named beside it."""

    def __init__(self, total: int) -> None:
        # disable=None: no bar unless stderr is a terminal (tqdm's own rule), so a
        # redirected log holds no bar redraws between its lines.
        self.bar = tqdm(
            total=total, desc="bench", file=sys.stderr, dynamic_ncols=True, disable=None
        )

    def __call__(self, done: str) -> None:
        """One more measurement is done."""
        self.bar.update(1)
        self.bar.set_postfix_str(done)

    def close(self) -> None:
        """Remove the bar."""
        self.bar.close()
