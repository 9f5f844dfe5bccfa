"""Memory-mapped arrays that pickle by reference: the file, where the pixels lie, their layout.

A NumPy ``memmap`` pickles by value: its pixels are copied into the pickle. Spawned
processes (DataLoader workers on Windows and macOS, or with
``datamodule.worker_start_method=spawn``; ``ddp_spawn`` ranks) receive their dataset
pickled, so each would hold a private copy of every mapped tile: 2 ranks × 8 workers,
16 copies of the dataset. A ``MappedArray`` is a ``memmap`` (and its slices, views and
transposes are too) that pickles as its file's path, the byte offset of its first
pixel, its dtype, shape and strides; unpickled, it maps the same bytes of the file
again, so every process of the machine shares the page cache's one copy.

The file's identity (size, modification time, inode) is kept beside: a file replaced
or changed since it was first mapped is refused when it would be mapped again, naming
it, rather than read as other pixels. Arrays that hold no mapping (results of
arithmetic, copies) pickle by value, as any array does.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np


class ChangedFileError(OSError):
    """A mapped file changed (or went) between the mapping of one process and another's."""


class MappedArray(np.memmap):
    """A read-only ``np.memmap`` that pickles by reference (see the module's docstring).

    Made from a memmap with ``mapped_array``; otherwise it behaves as one, down to
    returning plain arrays from arithmetic and copies, as ``np.memmap`` does.
    """

    def __reduce__(self) -> Any:
        reference = self._reference()
        if reference is None:
            return np.asarray(self).__reduce__()  # holds no mapping: by value
        return (_reopened, reference)

    def _reference(self) -> tuple[str, int, int, str, tuple[int, ...], tuple[int, ...], Any] | None:
        """Path, file offset and length of the bytes spanned, dtype, shape, strides, identity."""
        handle = getattr(self, "_mmap", None)
        if handle is None or self.filename is None or self.size == 0:
            return None
        # The mapping starts at the offset rounded down to the allocation granularity
        # (np.memmap maps from there); this array's pixels lie somewhere inside it.
        mapped_from = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
        start = np.frombuffer(handle, np.uint8).__array_interface__["data"][0]
        first = self.__array_interface__["data"][0]
        low, high = _span(self.shape, self.strides, self.itemsize)
        at = mapped_from + (first - start) + low
        identity = getattr(self, "_identity", None) or _identity(self.filename)
        return (
            str(self.filename),
            at,
            high - low,
            self.dtype.str,
            tuple(self.shape),
            tuple(int(s) for s in self.strides),
            (identity, -low),
        )

    def __array_finalize__(self, obj: Any) -> None:
        super().__array_finalize__(obj)
        mapped = getattr(self, "_mmap", None) is not None
        self._identity = getattr(obj, "_identity", None) if mapped else None

    def __array_wrap__(self, arr: Any, context: Any = None, return_scalar: bool = False) -> Any:
        # np.memmap's own: a memmap only where one was given as the output; scalars, and
        # plain arrays for every computed result (which no longer lies in the file).
        arr = np.ndarray.__array_wrap__(self, arr, context, return_scalar)
        if self is arr:
            return arr
        if arr.shape == ():
            return arr[()]
        return arr.view(np.ndarray)

    def __getitem__(self, index: Any) -> Any:
        res = super().__getitem__(index)
        if isinstance(res, MappedArray) and getattr(res, "_mmap", None) is None:  # a copy
            return res.view(np.ndarray)
        return res


def mapped_array(array: np.memmap) -> MappedArray:
    """``array``, a read-only memmap, as a ``MappedArray`` (the same pixels, mapped once).

    ``array``: what ``np.load(mmap_mode="r")`` or ``tifffile.memmap(mode="r")`` returns.
    """
    shared = array.view(MappedArray)
    if shared.filename is not None:
        shared._identity = _identity(shared.filename)
    return shared


def _span(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """The lowest and one past the highest byte an array's elements take, from its first."""
    low = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True))
    high = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True)) + itemsize
    return low, high


def _identity(path: str | os.PathLike[str]) -> tuple[int, int, int]:
    """What tells a file from a replacement or a changed one: size, mtime (ns), inode."""
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns, stat.st_ino


def _reopened(
    path: str,
    at: int,
    length: int,
    dtype: str,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    check: tuple[tuple[int, int, int], int],
) -> MappedArray:
    """The array a pickled ``MappedArray`` stands for, mapped again from its file."""
    identity, first = check
    try:
        now = _identity(path)
    except OSError as error:
        raise ChangedFileError(
            f"{path}: the memory-mapped file is gone ({error}); it was deleted or moved "
            "while a run was reading it"
        ) from None
    if now != tuple(identity):
        raise ChangedFileError(
            f"{path}: the memory-mapped file changed (size, time or inode) since the run "
            "mapped it; a process would read other pixels than the run's. Leave the data "
            "unchanged while a run reads it, then start the run again"
        )
    base = np.memmap(path, dtype=np.uint8, mode="r", offset=at, shape=(length,))
    view = np.ndarray(shape, np.dtype(dtype), buffer=base, offset=first, strides=strides)
    shared = view.view(MappedArray)
    shared.__array_finalize__(base)  # takes the mapping, file name and offset of base
    shared._identity = now
    return shared
