"""Images that cannot be read by window (PNG, JPEG), decoded once per machine and memory-mapped.

A PNG or JPEG must be decoded whole before any window of it can be read. Decoded into
every rank's memory, a dataset of them costs its decoded size once per rank. So
training decodes each such file once per machine into a raw array file, and every rank
and DataLoader worker of the machine maps it: the decoded pixels live in the page
cache, shared and reclaimable, and a dataset larger than memory is read from disk where
it must be.

The cache owns a folder of its own, ``segscale-decoded`` inside ``datamodule.decode_cache.folder``
(the user's cache folder by default: ``user_cache``), created owner-only and marked with a
``CACHEDIR.TAG`` of segscale's (backup tools skip such folders); a folder of that name
another user owns, others can write, or that holds other files without the tag is
refused (``user_cache.private_folder``). Inside, it writes only the forms
``<32 hex digits>.json`` (an entry's record), ``<32 hex digits>.npy`` (its array),
``build-<hex digit>.lock`` (16 locks, each shared by the entries whose key starts with
its digit, so no lock is left behind per entry) and ``atomic_files``' temporaries, and
deletes only an entry whose record is its own: the key in its name is the digest of the
source's identity in its record. Nothing outside that folder is ever deleted.

An entry is keyed by the source's path, its identity (``source_identity``: size, mtime,
inode and change time, so a replacement that keeps size and mtime is decoded again) and
what is kept of it (``variant``). One process builds it while the others of the machine
wait (the entry's lock); the record (the identity, the array's shape and type, and an
XXH3-128 digest of its pixels) is written first and the array after it, each whole or
not at all. An entry is used only when its record matches the source and its array
matches the record, the digest included: every mapping checks it (mapping so costs
2-3% of decoding a 2048² PNG, experiments/decode-cache-digest), so an entry damaged or
changed on disk is decoded again, with a warning naming it, never trained on. The cache keeps under
``max_gb``: the entries used longest ago make room (each use marks its record), and a
file that still does not fit, or meets a full disk or a folder that cannot be written,
is decoded into memory instead, with one warning per cause (the run trains from the
source).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from filelock import FileLock, Timeout

from segscale.atomic_files import (
    TEMPORARY_NAME,
    remove_stale_temporaries,
    write_atomically,
    write_text_atomically,
)
from segscale.data.storage.caches import cache_folder, private_folder, source_identity
from segscale.data.storage.mapped_arrays import mapped_array
from segscale.data.storage.rasters import UnreadableWindowError
from segscale.errors import FULL, ConfigError, require

log = logging.getLogger(__name__)

FORMAT = 2
"""The version of an entry's layout; another one is rebuilt (2: the pixels' digest)."""
KEY = "datamodule.decode_cache"
STORE = "segscale-decoded"
"""The cache's own folder inside ``datamodule.decode_cache.folder``."""
MARKER = "CACHEDIR.TAG"
# The first line of a CACHEDIR.TAG, by the Cache Directory Tagging Specification.
_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"
_OWNER = "# segscale's decode cache (datamodule.decode_cache)"
_MARKER_TEXT = (
    f"{_SIGNATURE}\n{_OWNER}: PNG and JPEG files decoded once per machine.\n"
    "# segscale deletes only its own entries here; delete the whole folder to clear it\n"
    "# (no run may be using it).\n"
)
_RECORD = re.compile(r"^[0-9a-f]{32}\.json$")
RECOUNT_S = 1.0
"""How old a count of the entries' bytes may be before the size limit counts them again:
the limit may be passed by what the machine's other processes write within it."""
_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


class DecodeCache:
    """Decoded arrays of PNG/JPEG files on local disk, memory-mapped (``datamodule.decode_cache``).

    ``folder``: where the cache's own folder goes (``None``: the user's cache folder; on a
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
        self.default = not folder
        self.folder = Path(folder).expanduser() if folder else cache_folder()
        self.store = self.folder / STORE
        self.max_gb = max_gb
        self.max_bytes = int(max_gb * 1e9)
        self._ready = False
        self._unwritable = ""  # why the store cannot be written, once found
        self._warned: set[str] = set()
        # The entries' bytes as last counted, plus what this process wrote since, and
        # when they were counted (time.monotonic()); None: not counted yet.
        self._tally: int | None = None
        self._counted_at = 0.0

    def open(self, source: Path, variant: str, decode: Callable[[], np.ndarray]) -> np.ndarray:
        """The decoded array of ``source``, memory-mapped from its entry (built if need be).

        ``variant`` tells apart what is kept of one file (an image, or a mask decoded with
        given labels); ``decode`` decodes it (called only to build the entry). Should the
        entry not fit (the size limit, a full disk, a folder that cannot be written), the
        decoded array itself is returned. Raises ``ConfigError`` where the cache's folder
        is not private or not its own.
        """
        identity = {
            "format": FORMAT,
            "source": str(source.resolve()),
            "variant": variant,
            "file": source_identity(source),
        }
        key = _key(identity)
        if not self._prepare():
            return decode()
        mapped, _ = _mapped(self.store, key, identity)
        if mapped is not None:
            _mark_used(self.store / f"{key}.json")
            return mapped
        if self._unwritable:
            return decode()
        return self._build(source, key, identity, decode)

    def ready(self) -> bool:
        """Make and check the cache's folder (once); whether it can be used, at least read.

        Raises ``ConfigError`` where the folder is not private or not the cache's own;
        says why (a warning) where it cannot be made or written.
        """
        return self._prepare()

    def _build(
        self, source: Path, key: str, identity: dict[str, Any], decode: Callable[[], np.ndarray]
    ) -> np.ndarray:
        """Build entry ``key`` of ``source`` under its lock (unless another did), and map it."""
        try:
            lock = _lock(self.store, key)
            lock.acquire()
        except OSError as error:
            self._cannot_write(error)
            return decode()
        try:
            mapped, damage = _mapped(self.store, key, identity)  # another built it
            if mapped is not None:
                return mapped
            if damage:
                log.warning(
                    "%s: its entry in the decode cache (%s) %s: decoded again",
                    source,
                    self.store / f"{key}.npy",
                    damage,
                )
            array = decode()
            room = self._make_room(array.nbytes, keep=key)
            if room:
                return self._uncached(source, array, *room)
            try:
                _write_entry(array, self.store, key, identity)
                if self._tally is not None:
                    self._tally += array.nbytes
            except OSError as error:
                if error.errno in FULL:
                    return self._uncached(source, array, "disk", "the disk is full")
                if error.errno not in _UNWRITABLE:
                    raise
                self._cannot_write(error)
                return array
        finally:
            lock.release()
        mapped, damage = _mapped(self.store, key, identity)
        if mapped is None:  # written, yet not readable back: the disk lost it
            why = f"its entry could not be read back: {damage or 'it is gone'}"
            return self._uncached(source, array, "lost", why)
        return mapped

    def _prepare(self) -> bool:
        """Make and check the cache's folder once; whether it can be used (read, at least)."""
        if not self._ready and not self._unwritable:
            advice = f"or give {KEY}.folder=<a folder of yours>"
            try:
                if self.default:
                    private_folder(self.folder, advice)
                else:
                    self.folder.mkdir(parents=True, exist_ok=True)
                private_folder(self.store, advice)
                _claim(self.store)
                remove_stale_temporaries(self.store)  # of builders that were killed
            except OSError as error:
                self._cannot_write(error)
                return False
            self._ready = True
        return self._ready

    def _make_room(self, size: int, keep: str) -> tuple[str, str] | None:
        """Free ``size`` bytes under the limit, least recently used entries first.

        Returns ``None`` where it did, else the cause (``limit``, ``disk``) and why.
        """
        if size > self.max_bytes:
            return "limit", f"{size / 1e9:.2f} GB decoded is more than {KEY}.max_gb"
        # The folder is counted again (a listing and two stats per entry) only where the
        # new entry might not fit, or where the count is older than RECOUNT_S (the other
        # processes of the machine write too): counting it for every entry made filling
        # the cache quadratic (9 s of 13 for CamVid's 936 files, issue 49).
        recent = time.monotonic() - self._counted_at < RECOUNT_S
        if self._tally is not None and recent and self._tally + size <= self.max_bytes:
            return self._disk_room(size)
        entries = _entries(self.store)
        used = sum(bytes_ for _, bytes_ in entries)
        for key, bytes_ in entries:  # least recently used first
            if used + size <= self.max_bytes:
                break
            if key != keep and _remove_entry(self.store, key, held=keep):
                used -= bytes_
        self._tally, self._counted_at = used, time.monotonic()
        if used + size > self.max_bytes:
            return "limit", f"the entries in use fill {KEY}.max_gb"
        return self._disk_room(size)

    def _disk_room(self, size: int) -> tuple[str, str] | None:
        """``None`` where the disk has ``size`` bytes free, else the cause and why."""
        free = shutil.disk_usage(self.store).free
        if free < size:
            return "disk", f"the disk has {free / 1e9:.2f} GB free, {size / 1e9:.2f} GB are needed"
        return None

    def _uncached(self, source: Path, array: np.ndarray, cause: str, why: str) -> np.ndarray:
        """``array``, with a warning the first time this cache meets ``cause``."""
        if cause not in self._warned:
            self._warned.add(cause)
            advice = {
                "limit": f"raise {KEY}.max_gb (now {self.max_gb:g})",
                "disk": f"give {KEY}.folder=<a folder on a disk with room>",
                "lost": f"check the disk of {self.store}",
            }[cause]
            log.warning(
                "%s: not cached in %s (%s): decoded into memory for this run; %s "
                "(other files not cached for this reason are not named)",
                source,
                self.store,
                why,
                advice,
            )
        return array

    def _cannot_write(self, error: OSError) -> None:
        """Note and say that the cache's folder cannot be made or written (not tried again)."""
        self._unwritable = str(error)
        what = "is not a folder" if _not_a_folder(error) else "cannot be written"
        log.warning(
            "the decode cache's folder %s %s (%s): PNG and JPEG files are decoded into each "
            "process's memory for this run. Give %s.folder=<a writable folder>, or %s=null "
            "to decode into memory without this warning",
            error.filename or self.store,
            what,
            error,
            KEY,
            KEY,
        )


class CachedFile:
    """A file's decoded array in ``cache``, opened (and built, if need be) when first read.

    Opening the cache's entries of a whole dataset before the first step decoded every
    file in one process (13 s for CamVid's 936 files on 2 cores, issue 49): a
    ``CachedFile`` stands for its array with the ``shape`` and ``dtype`` its header
    declares, and the process that first reads a window of it opens it, a DataLoader
    worker as a rule, so the machine's workers fill the cache in parallel while training
    runs. ``decode`` decodes it (picklable: a spawned worker receives it). Pickled once
    opened, the array goes as it is (a ``MappedArray`` by reference). A file that no
    longer decodes, or no longer to the declared shape, is an ``UnreadableWindowError``
    (the dataset check read it whole: it changed since), which a dataset stops or skips
    on as for a TIFF window.
    """

    def __init__(
        self,
        cache: DecodeCache,
        source: Path,
        variant: str,
        decode: Callable[[], np.ndarray],
        shape: tuple[int, ...],
        dtype: Any,
    ) -> None:
        self.cache = cache
        self.source = source
        self.variant = variant
        self.decode = decode
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self._array: np.ndarray | None = None

    @property
    def ndim(self) -> int:
        """2 (H×W) or 3 (H×W×C), as the array it stands for."""
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> Any:
        return self.opened()[index]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = np.asarray(self.opened())
        return whole if dtype is None else whole.astype(dtype)

    def opened(self) -> np.ndarray:
        """The array, mapped from its entry (built first if need be) at the first call."""
        if self._array is None:
            array = self.cache.open(self.source, self.variant, self._decoded)
            if tuple(array.shape) != self.shape or array.dtype != self.dtype:
                raise UnreadableWindowError(
                    f"{self.source}: decodes to {list(array.shape)} {array.dtype}, not the "
                    f"{list(self.shape)} {self.dtype} its header declared to the dataset check",
                    self.source,
                )
            self._array = array
        return self._array

    def _decoded(self) -> np.ndarray:
        """``decode()``; a file that no longer decodes is an ``UnreadableWindowError``."""
        try:
            return self.decode()
        except (OSError, ValueError) as error:
            if isinstance(error, UnreadableWindowError):
                raise
            message = f"{self.source}: cannot be decoded any more ({error})"
            raise UnreadableWindowError(message, self.source) from error


def _key(identity: dict[str, Any]) -> str:
    """An entry's key: 32 hex digits of the digest of its source's identity."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def _digest(array: np.ndarray) -> str:
    """The XXH3-128 digest of a C-contiguous array's bytes (13 GB/s; hashlib's: 0.5)."""
    return xxhash.xxh3_128_hexdigest(array.data)


def _lock(store: Path, key: str) -> FileLock:
    """The lock of entry ``key``'s builder: one of 16, by the key's first digit."""
    return FileLock(str(store / f"build-{key[0]}.lock"))


def _claim(store: Path) -> None:
    """Mark ``store`` as the cache's own; refuse it where it holds files and no mark of ours."""
    marker = store / MARKER
    if _ours(marker):
        return
    others = [p.name for p in store.iterdir() if not TEMPORARY_NAME.match(p.name)]
    if not others:
        write_text_atomically(marker, _MARKER_TEXT)
        return
    # Another process of the machine may have marked it and begun since the first look:
    # the mark comes before anything else it writes.
    if _ours(marker):
        return
    shown = ", ".join(sorted(others)[:3]) + (", ..." if len(others) > 3 else "")
    raise ConfigError(
        f"{store} is not segscale's decode cache (it holds {shown} and no {MARKER} of "
        f"segscale's), and segscale never deletes files it did not write: move it away, "
        f"or give {KEY}.folder=<another folder>"
    )


def _ours(marker: Path) -> bool:
    """Whether ``marker`` is the tag segscale writes into its decode cache's folder."""
    try:
        return marker.read_text(encoding="utf-8").startswith(f"{_SIGNATURE}\n{_OWNER}")
    except (OSError, UnicodeDecodeError):
        return False


def _mapped(store: Path, key: str, identity: dict[str, Any]) -> tuple[np.ndarray | None, str]:
    """Entry ``key``'s array, mapped, if its record vouches for it; else why not.

    The reason is empty where there is no entry of this source yet (or only the record
    a killed builder left), and says what is wrong where the entry is damaged.
    """
    try:
        record = json.loads((store / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, ""
    if not isinstance(record, dict) or record.get("identity") != identity:
        return None, ""
    try:
        mapped = mapped_array(np.load(store / f"{key}.npy", mmap_mode="r", allow_pickle=False))
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError) as error:
        return None, f"cannot be read ({error})"
    shape, dtype = list(mapped.shape), str(mapped.dtype)
    if shape != record.get("shape") or dtype != record.get("dtype"):
        recorded = f"{record.get('shape')} {record.get('dtype')}"
        return None, f"holds {shape} {dtype}, not the {recorded} of its record"
    if not mapped.flags.c_contiguous or _digest(mapped) != record.get("digest"):
        return None, "no longer matches the digest of the pixels written into it"
    return mapped, ""


def _write_entry(array: np.ndarray, store: Path, key: str, identity: dict[str, Any]) -> None:
    """Write the record, then the array: each whole or not at all, the record first.

    A builder killed between them leaves a record without an array, which is no entry
    (and is the cache's own to delete), never an array without a record.
    """
    array_file, record_file = store / f"{key}.npy", store / f"{key}.json"
    array_file.unlink(missing_ok=True)  # the new record never vouches for an old array
    contiguous = np.ascontiguousarray(array)
    record = {
        "identity": identity,
        "shape": list(contiguous.shape),
        "dtype": str(contiguous.dtype),
        "digest": _digest(contiguous),
    }
    # Not flushed to disk (durable=False): an entry a power loss damages fails its digest
    # when mapped and is decoded again, and the flushes took a third of filling the cache.
    write_text_atomically(record_file, json.dumps(record), durable=False)
    save = lambda stream: np.save(stream, contiguous, allow_pickle=False)  # noqa: E731
    write_atomically(array_file, save, durable=False)
    _mark_used(record_file)


def _entries(store: Path) -> list[tuple[str, int]]:
    """Each record in ``store`` by the allowed name: its key and its array's bytes.

    Least recently used first; an array without its record is no entry and not counted.
    """
    found = []
    for record in store.iterdir():
        if not _RECORD.match(record.name):
            continue
        try:
            used = record.stat().st_mtime_ns
        except OSError:
            continue
        try:
            bytes_ = record.with_suffix(".npy").stat().st_size
        except OSError:
            bytes_ = 0
        found.append((used, record.stem, bytes_))
    return [(key, bytes_) for _, key, bytes_ in sorted(found)]


def _remove_entry(store: Path, key: str, held: str) -> bool:
    """Delete entry ``key`` if it is the cache's own and no other process is building it.

    ``held``: the key this process is building, whose lock it holds (and so may delete
    the entries that share it). An entry is the cache's own when its record names a
    source whose identity's digest is ``key``: a file the cache did not write is left.
    """
    if key[0] == held[0]:  # the same lock: held by this process already
        return _delete_own_entry(store, key)
    lock = _lock(store, key)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    try:
        return _delete_own_entry(store, key)
    finally:
        lock.release()


def _delete_own_entry(store: Path, key: str) -> bool:
    """Delete entry ``key``'s array, then its record, if the record is the cache's own.

    Whether the array's bytes are freed. Windows deletes no file another process maps
    (nor renames one): an entry in use is left whole, counted, for a later eviction. The
    array goes first, so no array outlives its record (it would be no entry, never
    deleted); a record left without its array (Windows: read that instant) is no entry.
    """
    record_file = store / f"{key}.json"
    try:
        record = json.loads(record_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    identity = record.get("identity") if isinstance(record, dict) else None
    if not isinstance(identity, dict) or _key(identity) != key:
        return False
    try:
        (store / f"{key}.npy").unlink(missing_ok=True)
    except OSError:  # in use (Windows), or a folder that cannot be written: left whole
        return False
    with contextlib.suppress(OSError):  # else deleted with the next eviction, or rebuilt
        record_file.unlink(missing_ok=True)
    return True


def _mark_used(record: Path) -> None:
    """Note that the entry was used now (the size limit removes the least recently used first).

    The time is set, not left to the file system's coarse clock, so that entries used
    within one of its ticks keep their order.
    """
    now = time.time_ns()
    with contextlib.suppress(OSError):
        os.utime(record, ns=(now, now))


def _not_a_folder(error: OSError) -> bool:
    """Whether ``error`` says that a path of the folder is a file."""
    return isinstance(error, (FileExistsError, NotADirectoryError))
