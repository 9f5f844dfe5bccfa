"""Images that cannot be read by window (PNG, JPEG), decoded once per machine and memory-mapped.

A PNG or JPEG must be decoded whole before any window of it can be read. Decoded into
every rank's memory, a dataset of them costs its decoded size once per rank. So
training decodes each such file once per machine into a raw array file here
(``<folder>/<key>.npy``, ``datamodule.decode_cache``), and every rank and DataLoader
worker of the machine maps it: the decoded pixels live in the page cache, shared and
reclaimable, and a dataset larger than memory is read from disk where it must be.

One process builds an entry, the others of the machine wait for it (a lock per entry,
``filelock``); the entry appears whole or not at all (written beside, moved into place),
and its record (``<key>.json``: the source's size and time, the array's shape and type,
the file's size) is written last. An entry is used only when its record matches the
source and the array file (a partial, truncated or stale entry is rebuilt, never read);
bits flipped inside a complete file are not looked for, as reading every entry at every
start would cost what the cache saves. The cache keeps under ``max_gb``: the entries
used longest ago make room, and a file that still does not fit, or meets a full disk,
is decoded into memory instead, with a warning (the run trains from the source).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock, Timeout

from segscale.atomic_files import (
    remove_stale_temporaries,
    write_atomically,
    write_text_atomically,
)
from segscale.data.user_cache import APP, cache_home
from segscale.disk_full import FULL
from segscale.errors import ConfigError, require

log = logging.getLogger(__name__)

FORMAT = 1
"""The version of an entry's layout; another one is rebuilt."""
KEY = "datamodule.decode_cache"


class DecodeCache:
    """Decoded arrays of PNG/JPEG files on local disk, memory-mapped (``datamodule.decode_cache``).

    ``folder``: where the entries go (``None``: ``$XDG_CACHE_HOME/segscale/decoded``; on a
    cluster, a disk local to the node); ``max_gb``: the size the entries may take.
    """

    def __init__(self, folder: str | None = None, max_gb: float = 50.0) -> None:
        require(
            max_gb,
            f"{KEY}.max_gb",
            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
            "a size in GB > 0 (datamodule.decode_cache=null decodes into memory instead)",
        )
        if folder is not None and not isinstance(folder, str):
            raise ConfigError(f"{KEY}.folder={folder!r} is not allowed: expected a path or null")
        self.folder = Path(folder).expanduser() if folder else cache_home() / APP / "decoded"
        self.max_bytes = int(max_gb * 1e9)

    def open(self, source: Path, variant: str, decode: Callable[[], np.ndarray]) -> np.ndarray:
        """The decoded array of ``source``, memory-mapped from its entry (built if need be).

        ``variant`` tells apart what is kept of one file (an image, or a mask decoded with
        given labels); ``decode`` decodes it (called only to build the entry). Should the
        entry not fit (the size limit, a full disk), the decoded array itself is returned.
        """
        stat = source.stat()
        identity = {
            "format": FORMAT,
            "source": str(source.resolve()),
            "variant": variant,
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
        }
        key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
        array_file, record_file = self.folder / f"{key}.npy", self.folder / f"{key}.json"
        mapped = _valid_entry(array_file, record_file, identity)
        if mapped is not None:
            _touch(record_file)
            return mapped
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(self.folder / f"{key}.lock"))
            lock.acquire()
        except OSError as error:
            return self._uncached(source, decode(), f"cannot be written ({error})")
        try:
            mapped = _valid_entry(array_file, record_file, identity)  # another built it
            if mapped is not None:
                return mapped
            array = decode()
            room = self._make_room(array.nbytes, keep=key)
            if room:
                return self._uncached(source, array, room)
            try:
                _write_entry(array, array_file, record_file, identity)
            except OSError as error:
                if error.errno not in FULL:
                    raise
                return self._uncached(source, array, "the disk is full")
        finally:
            lock.release()
        mapped = _valid_entry(array_file, record_file, identity)
        if mapped is None:  # written, yet not readable back: the disk lost it
            return self._uncached(source, array, "its entry could not be read back")
        return mapped

    def _make_room(self, size: int, keep: str) -> str:
        """Free ``size`` bytes under the limit, oldest entries first; why not, if it cannot."""
        if size > self.max_bytes:
            return f"{size / 1e9:.2f} GB decoded is more than {KEY}.max_gb"
        entries = _entries(self.folder)
        used = sum(bytes_ for _, bytes_, _ in entries)
        for name, bytes_, _ in entries:  # oldest use first
            if used + size <= self.max_bytes:
                break
            if name != keep and _remove_entry(self.folder, name):
                used -= bytes_
        if used + size > self.max_bytes:
            return f"the entries in use fill {KEY}.max_gb"
        free = shutil.disk_usage(self.folder).free
        if free < size:
            return f"the disk has {free / 1e9:.2f} GB free, {size / 1e9:.2f} GB are needed"
        return ""

    def _uncached(self, source: Path, array: np.ndarray, why: str) -> np.ndarray:
        log.warning(
            "%s: not cached in %s (%s): decoded into memory for this run (%s)",
            source,
            self.folder,
            why,
            f"raise {KEY}.max_gb or give {KEY}.folder on a disk with room",
        )
        return array


def _valid_entry(array_file: Path, record_file: Path, identity: dict[str, Any]) -> Any:
    """The entry's array, memory-mapped, if its record and file are whole and match."""
    try:
        record = json.loads(record_file.read_text())
        if not isinstance(record, dict) or record.get("identity") != identity:
            return None
        if array_file.stat().st_size != record.get("file_bytes"):
            return None
        mapped = np.load(array_file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, json.JSONDecodeError):
        return None
    if list(mapped.shape) != record.get("shape") or str(mapped.dtype) != record.get("dtype"):
        return None
    return mapped


def _write_entry(
    array: np.ndarray, array_file: Path, record_file: Path, identity: dict[str, Any]
) -> None:
    """Write the array, then its record: each whole or not at all."""
    record_file.unlink(missing_ok=True)  # a stale record never vouches for a new file
    remove_stale_temporaries(array_file.parent)  # of builders that were killed
    contiguous = np.ascontiguousarray(array)
    write_atomically(array_file, lambda stream: np.save(stream, contiguous, allow_pickle=False))
    record = {
        "identity": identity,
        "shape": list(array.shape),
        "dtype": str(array.dtype),
        "file_bytes": array_file.stat().st_size,
    }
    write_text_atomically(record_file, json.dumps(record))


def _entries(folder: Path) -> list[tuple[str, int, float]]:
    """Each entry of ``folder``: its key, its bytes and when it was last used, oldest first."""
    found = []
    for record in folder.glob("*.json"):
        try:
            used = record.stat().st_mtime
            bytes_ = (record.with_suffix(".npy")).stat().st_size
        except OSError:
            continue
        found.append((record.stem, bytes_, used))
    return sorted(found, key=lambda entry: entry[2])


def _remove_entry(folder: Path, key: str) -> bool:
    """Delete entry ``key`` unless another process holds its lock (it may be building it)."""
    lock = FileLock(str(folder / f"{key}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    try:
        (folder / f"{key}.json").unlink(missing_ok=True)
        (folder / f"{key}.npy").unlink(missing_ok=True)
    finally:
        lock.release()
    return True


def _touch(record: Path) -> None:
    """Note that the entry was used now (the size limit removes the least recent first)."""
    with contextlib.suppress(OSError):
        os.utime(record)
