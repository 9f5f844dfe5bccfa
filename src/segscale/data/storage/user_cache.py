r"""Where segscale keeps what it caches for the user: a folder of the platform's, theirs alone.

``$XDG_CACHE_HOME/segscale`` where ``XDG_CACHE_HOME`` is set to an absolute path, on any
platform; else the platform's own place for a user's caches, as platformdirs knows it:
``~/.cache/segscale`` on Linux, ``~/Library/Caches/segscale`` on macOS (which Time
Machine skips), ``%LOCALAPPDATA%\segscale\Cache`` on Windows (not copied with a roaming
profile). Caches live there, not in the dataset folder, so a dataset shared with others
is left as it is, and a read-only one is cached like any other.

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

import platformdirs

from segscale.errors import ConfigError

APP = "segscale"
"""Our name in the user's cache (a folder of its own there)."""

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def cache_folder() -> Path:
    """The folder of ours in the user's cache (the module's docstring says where)."""
    given = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG specification: a relative path is invalid and is ignored.
    if given and os.path.isabs(given):
        return Path(given) / APP
    # No author folder on Windows (appauthor=False): %LOCALAPPDATA%\segscale\Cache.
    return platformdirs.user_cache_path(APP, appauthor=False)


def app_folder(kind: str) -> Path:
    """``<cache_folder>/<kind>``, made private where missing, refused where shared.

    Raises ``ConfigError`` where ``segscale`` or ``kind`` is another user's or writable
    by others (``private_folder``), ``OSError`` where it cannot be made (a read-only home).
    """
    advice = "or give XDG_CACHE_HOME=<a folder of yours>"
    private_folder(cache_folder(), advice)
    return private_folder(cache_folder() / kind, advice)


def cache_file(kind: str, key: str) -> Path:
    """The cache file of ``kind`` (a folder, e.g. ``validation``) for what ``key`` names.

    ``key`` identifies what the file caches (a dataset's resolved root and settings); it
    is hashed into the file name, so any text will do. Only the path: the folder is
    made (and checked) by ``app_folder``.
    """
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return cache_folder() / kind / f"{digest}.json"


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
