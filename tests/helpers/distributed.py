"""Run a function on two gloo ranks in spawned processes, as DDP would, on CPU."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, port: int, function: Callable[[int], Any], queue: Any) -> None:
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        queue.put((rank, function(rank)))
    finally:
        dist.destroy_process_group()


def on_two_ranks(function: Callable[[int], Any]) -> dict[int, Any]:
    """``{rank: function(rank)}`` for ranks 0 and 1 of a 2-process gloo group.

    ``function`` must be a module-level function (it is pickled into the processes).
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_worker, args=(r, port, function, queue)) for r in (0, 1)]
    for process in processes:
        process.start()
    results = dict(queue.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=60)
    return results
