"""The validation pass's reading: the pairs not cached, read on every core, once per machine.

Reading a dataset's pixels is most of the pass, so the pairs the cache lacks are read
side by side on threads, one pair each (``ThreadPoolExecutor``): decoding (Pillow,
GDAL) and the pass's counting (OpenCV, NumPy's element-wise and sorting operations)
release the GIL, so threads use the cores without another process, pickling or start
method. The threads are the cores this process may use (``cpus_available``), and a
pair's progress goes to the console (``segscale.progress``: a bar, or a line each tenth
of the way, with the time left).

Once per machine: the ranks of a job that torchrun or SLURM started check the dataset
at once, each its own pass. The first to find files to read holds a lock beside the
cache file (``segscale.recorded_lock``) while it reads them and saves the cache; the
others wait for it, then find the files in the cache. A holder that dies lets go of the
lock (filelock's native lock: ``flock``, ``LockFileEx`` on Windows, which the kernel
drops with its holder), and the next reads what is still missing. Where the cache
folder cannot be written, or has no native locks, each process reads on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from segscale.data.checks.validation_cache import ValidationCache
from segscale.data.classes.labels import LabelMap
from segscale.data.sampling.valid_windows import Validity
from segscale.data.storage.sources import ImageMaskPair
from segscale.platforms.cores import cpus_available
from segscale.progress import Progress
from segscale.recorded_lock import LockHeldError, RecordedLock, flock_works

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PairRequest:
    """One pair and what the pass asks of it (the cache's ``cached`` and ``read`` arguments)."""

    pair: ImageMaskPair
    labels: LabelMap | None = None
    locations_per_class: int = 0
    validity: Validity | None = None
    warp_masks: bool = False
    nodata: float | None = None
    """``datamodule.sampling.nodata``: the images' no-data value (``None``: their tags')."""

    def cached(self, cache: ValidationCache) -> dict[str, Any] | None:
        """The cache's facts for this request; ``None`` if they must be read."""
        return cache.cached(*self._arguments())

    def read(self, cache: ValidationCache) -> dict[str, Any]:
        """The facts read afresh, and kept in ``cache``."""
        return cache.read(*self._arguments())

    def _arguments(self) -> tuple[Any, ...]:
        return (
            self.pair,
            self.labels,
            self.locations_per_class,
            self.validity,
            self.warp_masks,
            self.nodata,
        )


def read_pairs(
    open_cache: Callable[[], ValidationCache],
    requests: Sequence[PairRequest],
    workers: int | None = None,
) -> list[dict[str, Any]]:
    """The facts of every request, in order: cached ones as they are, the others read.

    ``open_cache`` opens the dataset's cache (again, once another process has filled
    it); ``workers``: the threads that read (``None``: the cores this process may use).
    The pairs read are saved in the cache before the others are let in.
    """
    cache = open_cache()
    facts = [request.cached(cache) for request in requests]
    if any(f is None for f in facts):
        with _machine_turn(cache.path) as waited:
            if waited:  # another process read them meanwhile
                cache = open_cache()
                facts = [request.cached(cache) for request in requests]
            _read_missing(cache, requests, facts, workers or cpus_available())
            cache.save()
    return [f if f is not None else r.read(cache) for f, r in zip(facts, requests, strict=True)]


def _read_missing(
    cache: ValidationCache,
    requests: Sequence[PairRequest],
    facts: list[dict[str, Any] | None],
    workers: int,
) -> None:
    """Fill the ``facts`` that are ``None`` by reading their pairs, ``workers`` at a time.

    A pair asked for twice (a file in two splits) is read once, for its first request;
    the other takes it from the cache afterwards if it can, or reads it again.
    """
    first: dict[ImageMaskPair, int] = {}
    for index, found in enumerate(facts):
        if found is None:
            first.setdefault(requests[index].pair, index)
    order = list(first.values())
    progress = Progress(len(order), "dataset files checked", log)
    try:
        for index, read in _read_each(cache, [requests[i] for i in order], workers):
            facts[order[index]] = read
            progress.update()
    finally:
        progress.close()
    for index, found in enumerate(facts):
        if found is None:
            facts[index] = requests[index].cached(cache)


def _read_each(
    cache: ValidationCache, requests: Sequence[PairRequest], workers: int
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, facts)`` of each request as its read ends; in this thread if one will do."""
    if workers <= 1 or len(requests) <= 1:
        for index, request in enumerate(requests):
            yield index, request.read(cache)
        return
    pool = ThreadPoolExecutor(min(workers, len(requests)), thread_name_prefix="dataset-check")
    try:
        pending: dict[Future[dict[str, Any]], int] = {
            pool.submit(request.read, cache): index for index, request in enumerate(requests)
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield pending.pop(future), future.result()
    finally:
        # A failure or a stop (Ctrl-C, a preemption signal) ends the pass: the files not
        # started are dropped, the ones being read end with their read.
        pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def _machine_turn(cache_file: Path) -> Iterator[bool]:
    """Hold the lock of ``cache_file``'s pass; say whether another process held it first."""
    folder = cache_file.parent
    lock = RecordedLock(cache_file.with_suffix(".lock"))
    try:
        # The cache makes its folder private (user_cache.app_folder); one it could not
        # make (a read-only home) is not made here either, with other permissions.
        if not folder.is_dir():
            raise OSError(f"no cache folder {folder}")
        if not flock_works(folder):
            raise OSError("no native locks")  # a soft lock of a killed holder would stop every pass
        waited = False
        try:
            lock.acquire()
        except LockHeldError as held:
            log.info("waiting for %s, which is checking these dataset files", held.holder)
            lock.acquire(wait=True)
            waited = True
    except OSError as error:  # a read-only or lock-less cache folder: each reads its own
        log.debug("the dataset check is not shared with other processes: %s", error)
        yield False
        return
    try:
        yield waited
    finally:
        lock.release()
