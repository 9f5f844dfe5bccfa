"""Figures written to files: matplotlib without a window, PNGs that appear whole.

Shared by the training figures, the sweep table's curves and bench's plots: each draws
with matplotlib and writes through ``save_figure``. ``plt`` is pyplot on the ``Agg``
backend, selected here before pyplot is first imported.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

from segscale.atomic_files import write_atomically

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

__all__ = ["Figure", "plt", "save_figure"]


def save_figure(figure: Figure, path: Path) -> None:
    """Write ``figure`` to ``path`` atomically (a reader never sees half a PNG).

    A pyplot figure is closed afterwards; a ``Figure`` of its own is left to the collector.
    """
    try:
        write_atomically(
            path,
            lambda stream: figure.savefig(
                stream, format=path.suffix[1:], dpi=100, bbox_inches="tight"
            ),
        )
    finally:
        if figure.canvas.manager is not None:  # made by pyplot: it holds the figure
            plt.close(figure)
