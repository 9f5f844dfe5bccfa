"""Where segscale keeps what it caches for the user: ``$XDG_CACHE_HOME/segscale``, theirs alone.

The XDG base-directory rule: ``$XDG_CACHE_HOME`` when set to an absolute path, else
``~/.cache``. Caches live there, not in the dataset folder, so a dataset shared with
others is left as it is, and a read-only one is cached like any other.

What is cached there decides what a run trains on and reports (decoded pixels, the
dataset check's class counts), so the folders are private: created owner-only, and one
that another user owns or that others can write is refused (``private_folder``). On
Windows there are no owner and mode bits to check (access lists are another model, and
``os.stat`` reports only the read-only attribute): the folders are created and used
as they are.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

from segscale.errors import ConfigError

APP = "segscale"
"""The folder of ours under the cache home."""

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def cache_home() -> Path:
    """The user's cache folder: ``$XDG_CACHE_HOME``, else ``~/.cache``."""
    given = os.environ.get("XDG_CACHE_HOME", "")
    # The specification: a relative path is invalid and is ignored.
    return Path(given) if given and os.path.isabs(given) else Path.home() / ".cache"


def app_folder(kind: str) -> Path:
    """``$XDG_CACHE_HOME/segscale/<kind>``, made private where missing, refused where shared.

    Raises ``ConfigError`` where ``segscale`` or ``kind`` is another user's or writable
    by others (``private_folder``), ``OSError`` where it cannot be made (a read-only home).
    """
    advice = "or give XDG_CACHE_HOME=<a folder of yours>"
    private_folder(cache_home() / APP, advice)
    return private_folder(cache_home() / APP / kind, advice)


def cache_file(kind: str, key: str) -> Path:
    """The cache file of ``kind`` (a folder, e.g. ``validation``) for what ``key`` names.

    ``key`` identifies what the file caches (a dataset's resolved root and settings); it
    is hashed into the file name, so any text will do. Only the path: the folder is
    made (and checked) by ``app_folder``.
    """
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return cache_home() / APP / kind / f"{digest}.json"


def private_folder(folder: Path, advice: str) -> Path:
    """``folder``, created owner-only (0o700) where missing; its parents must exist or be made.

    Refused (``ConfigError`` naming the folder, what is wrong and ``advice``, the other
    way out) where it belongs to another user or others can write it, since whoever can
    write it decides what a run that trusts it reads. Raises ``OSError`` where it cannot
    be made or is not a folder (``FileExistsError``, ``NotADirectoryError``).
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    problem = _shared(folder)
    if problem:
        raise ConfigError(
            f"the cache folder {folder} {problem}: whoever can write it decides what "
            f"segscale reads from it (decoded images and masks, the dataset check's "
            f"findings). Make it yours alone (chmod 700 {folder}), {advice}"
        )
    return folder


def _shared(folder: Path) -> str:
    """What lets another user write ``folder`` (another owner, a group or other write bit)."""
    if sys.platform == "win32":
        return ""  # no owner or mode bits in os.stat (see the module's docstring)
    info = folder.stat()
    if info.st_uid != os.getuid():
        return f"belongs to another user (uid {info.st_uid}, not {os.getuid()})"
    if info.st_mode & _WRITABLE_BY_OTHERS:
        return f"can be written by others (mode {stat.S_IMODE(info.st_mode):o})"
    return ""
