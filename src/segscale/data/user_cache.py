"""Where segscale keeps what it caches for the user: ``$XDG_CACHE_HOME/segscale``.

The XDG base-directory rule: ``$XDG_CACHE_HOME`` when set to an absolute path, else
``~/.cache``. Caches live there, not in the dataset folder, so a dataset shared with
others is left as it is, and a read-only one is cached like any other.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

APP = "segscale"
"""The folder of ours under the cache home."""


def cache_home() -> Path:
    """The user's cache folder: ``$XDG_CACHE_HOME``, else ``~/.cache``."""
    given = os.environ.get("XDG_CACHE_HOME", "")
    # The specification: a relative path is invalid and is ignored.
    return Path(given) if given and os.path.isabs(given) else Path.home() / ".cache"


def cache_file(kind: str, key: str) -> Path:
    """The cache file of ``kind`` (a folder, e.g. ``validation``) for what ``key`` names.

    ``key`` identifies what the file caches (a dataset's resolved root and settings); it
    is hashed into the file name, so any text will do.
    """
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return cache_home() / APP / kind / f"{digest}.json"
