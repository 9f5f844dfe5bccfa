r"""What the caches share: the user's cache folder (the platform's, private), a file's identity.

Where segscale keeps what it caches for the user: a folder of the platform's, theirs alone.

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

A source file's identity for the caches: what a replacement with the same size and times changes.

The decode cache and the dataset check's cache keep what they learnt of a file while
its identity is unchanged. Size and modification time are not enough: ``cp -p``,
``rsync -t``, an archive extracted with its stored times or ``touch -d`` give another
file of the same size the old mtime. Where the system has them (Linux, macOS, every
POSIX system) the identity adds the inode number and the inode's change time
(``st_ctime_ns``): writing to a file or setting its times changes the change time, and
no call sets it back; a file put in place by a rename (``rsync``, an atomic save) is
another inode. A ``chmod``, ``chown``, a new hard link or a rename changes it too, and
costs one more read of the file, never a wrong one. The device number is left out:
it is assigned when a file system is mounted (NFS, btrfs, overlayfs), so it changes
across remounts and differs between the nodes that share a dataset, and the path
already names the file system.

On Windows ``st_ctime`` is the creation time, which a file overwritten in place keeps,
and ``os.stat`` has no change time; there the identity adds a digest of the file's
content instead (xxHash's XXH3-128, read in chunks). That reads every file once per
run, at the disk's speed, but decodes nothing.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

import platformdirs
import xxhash

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


_CHUNK = 1 << 20


def source_identity(path: Path) -> list[int | str]:
    """What tells ``path``'s content apart from any other (see the module's docstring).

    Raises ``OSError`` where ``path`` cannot be read (missing, a permission).
    """
    info = path.stat()
    identity: list[int | str] = [info.st_size, info.st_mtime_ns, info.st_ino]
    if has_change_time():
        identity.append(info.st_ctime_ns)
    else:
        identity.append(content_digest(path))
    return identity


def has_change_time() -> bool:
    """Whether ``os.stat``'s ``st_ctime`` is the inode's change time (not Windows' creation)."""
    return sys.platform != "win32"


def content_digest(path: Path) -> str:
    """The XXH3-128 digest of ``path``'s bytes, in hex, read a chunk at a time."""
    digest = xxhash.xxh3_128()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
