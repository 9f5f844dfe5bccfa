"""The installed segscale's version (``segscale.__version__``), for what records it.

Checkpoints store it beside their format, for the messages that refuse one of another
format. A source tree on ``sys.path`` that was never installed has none: ``0+unknown``.
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("segscale")
except metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"
