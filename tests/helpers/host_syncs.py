"""Counting the operations that make the host wait for the device (docs/architecture.md).

A GPU runs the kernels the host queues while the host goes on queuing; an operation
whose result the host must *read* (a number it branches on, a shape it allocates)
stops it until the device has caught up, and the device then idles until the host
queues more. ``HostSyncCounter`` counts such operations while the same code runs on
CPU tensors, so the test suite tells, without a GPU, what would synchronize on one.

It is a ``TorchDispatchMode``: it sees every ATen operation below autograd, from
Python and from C++ alike, including those of the backward pass (the mode is
thread-local state, which the autograd engine carries to the threads it runs backward
on). An operation counts when, on CUDA, it synchronizes the host:

- ``aten._local_scalar_dense``: ``item()``, ``float(t)``, ``int(t)``, ``bool(t)``,
  ``if t:``, ``t.tolist()`` of one element (``is_nonzero`` and ``item`` reach it too).
  The value lives on the device; the host waits for it.
- ``aten.equal``, ``aten.allclose``: return a Python bool computed on the device.
- Operations whose output *shape* depends on the data, so the host must read a count
  before it can allocate the output (ops tagged ``dynamic_output_shape``):
  ``aten.nonzero``, ``aten.argwhere``, ``aten.masked_select``, ``aten.unique*``,
  ``aten.repeat_interleave`` with a tensor of repeats and no ``output_size``,
  ``aten.bincount`` (it reads the largest value), ``aten._ctc_loss`` (it copies the
  lengths to the host), ``aten.one_hot`` without ``num_classes``.
  ``aten.nonzero_static`` does not count: its size is given.
- ``aten.index`` (``t[mask]``) with a boolean or uint8 index: a hidden ``nonzero``.
  Integer indices do not count.
- ``aten.index_put_`` (``t[mask] = v``) with a boolean index, unless ``v`` is a single
  number (PyTorch then uses ``masked_fill_``, which needs no count). A device-resident
  0-dim ``v`` does synchronize there; on CPU it cannot be told from a Python number.
- ``aten.histc`` with ``min == max`` (the range is read from the data).
- ``aten._linalg_check_errors``: ``linalg`` functions that raise on a singular input
  read the error codes on the host.
- ``c10d.barrier``: under NCCL a barrier blocks the host until the device's current
  stream has finished (PyTorch PRs 96785 and 137516). Other collectives are not
  counted: NCCL queues them on a stream and the host goes on.

``Tensor.cpu()``, ``Tensor.numpy()`` and ``Tensor.tolist()`` copy device memory to
the host and wait for it; on CPU they dispatch no ATen operation, so they are counted
as Python calls (by a ``TorchFunctionMode`` that the counter enters with itself).
What cannot be seen on CPU: other copies between host and device (``.to("cpu")``,
``torch.tensor(..., device=...)`` from host data, both blocking copies on CUDA), since
on CPU the source and target devices are the same.

Checks that PyTorch runs on the CPU only are not counted: ``one_hot`` with
``num_classes`` reads the smallest and largest class on the host on CPU, but relies
on device-side assertions on CUDA.

Counts are kept per *phase*, a name the caller sets (``in_phase``, or ``phase``
directly from callbacks): a training step is allowed one host decision inside the
optimizer step (whether the step's loss and gradients are finite), and none outside.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

ALWAYS_SYNC = {
    "_local_scalar_dense",
    "item",
    "is_nonzero",
    "equal",
    "allclose",
    "nonzero",
    "argwhere",
    "masked_select",
    "_unique",
    "_unique2",
    "unique_consecutive",
    "unique_dim",
    "unique_dim_consecutive",
    "bincount",
    "_ctc_loss",
    "_linalg_check_errors",
}
"""ATen operations (by base name) that synchronize the host whatever their arguments."""

HOST_COPIES = ("cpu", "numpy", "tolist")
"""``Tensor`` methods that copy to the host, counted as ``Tensor.<name>``."""


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _index_put_syncs(func: Any, args: tuple, kwargs: dict) -> bool:
    indices, values = args[1], args[2]
    accumulate = _argument(args, kwargs, 3, "accumulate", False)
    return any(_is_mask(i) for i in indices) and (accumulate or values.numel() != 1)


def _argument(args: tuple, kwargs: dict, position: int, name: str, default: Any) -> Any:
    return args[position] if len(args) > position else kwargs.get(name, default)


CONDITIONAL_SYNC: dict[str, Callable[[Any, tuple, dict], bool]] = {
    "index": lambda func, args, kwargs: any(_is_mask(i) for i in args[1]),
    "index_put": _index_put_syncs,
    "index_put_": _index_put_syncs,
    "_index_put_impl_": _index_put_syncs,
    # repeat_interleave(repeats) counts its output from the repeats; given, it need not.
    "repeat_interleave": lambda func, args, kwargs: (
        func._overloadname == "Tensor" and kwargs.get("output_size") is None
    ),
    "histc": lambda func, args, kwargs: (
        _argument(args, kwargs, 2, "min", 0) == _argument(args, kwargs, 3, "max", 0)
    ),
}
"""ATen operations that synchronize the host for some arguments only."""


def sync_name(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str | None:
    """``namespace.op`` if running ``func`` on CUDA would synchronize the host, else None."""
    namespace = func.namespace
    base = func._schema.name.split("::")[-1]
    if namespace == "c10d":
        return "c10d.barrier" if base == "barrier" else None
    if namespace != "aten":
        return None
    if base in ALWAYS_SYNC:
        return f"aten.{base}"
    condition = CONDITIONAL_SYNC.get(base)
    if condition is not None and condition(func, args, kwargs):
        return f"aten.{base}"
    return None


class _PythonLevelSyncs(TorchFunctionMode):
    """The counter's Python half: host copies, and PyTorch's CPU-only checks."""

    def __init__(self, counter: HostSyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in HOST_COPIES and getattr(func, "__objclass__", None) is torch._C.TensorBase:
            self.counter.count(f"Tensor.{name}")
        if func is torch.nn.functional.one_hot:
            # On CPU one_hot checks the class range with item(); CUDA relies on device-side
            # asserts, and reads the largest class only to find num_classes.
            if _argument(args, kwargs, 1, "num_classes", -1) < 0:
                self.counter.count("aten.one_hot")
            with self.counter.ignoring():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


class HostSyncCounter(TorchDispatchMode):
    """Counts, per phase and operation, the operations that would synchronize a GPU host.

    Use it as a context manager around the code to measure (or enter and exit it from
    two callbacks of the same thread)::

        with HostSyncCounter() as counter:
            loss = model(x).sum()
            loss.backward()
            with counter.in_phase("optimizer"):
                optimizer.step()
        counter.counts  # {"step": Counter({"aten._local_scalar_dense": 1}), ...}

    ``phase`` names where counts go now (``"step"`` at first). See the module
    docstring for what counts and why.
    """

    def __init__(self, phase: str = "step") -> None:
        super().__init__()
        self.phase = phase
        self.counts: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self._ignore_depth = 0
        self._python_level = _PythonLevelSyncs(self)

    def __enter__(self) -> HostSyncCounter:
        self._python_level.__enter__()
        try:
            super().__enter__()
        except BaseException:
            self._python_level.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            super().__exit__(*exc_info)
        finally:
            self._python_level.__exit__(*exc_info)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = sync_name(func, args, kwargs)
        if name is not None:
            self.count(name)
        return func(*args, **kwargs)

    def count(self, name: str) -> None:
        """Count one synchronizing operation ``name`` in the current phase."""
        if not self._ignore_depth:
            self.counts[self.phase][name] += 1

    @contextmanager
    def ignoring(self) -> Iterator[None]:
        """Count nothing inside (PyTorch's CPU-only checks)."""
        self._ignore_depth += 1
        try:
            yield
        finally:
            self._ignore_depth -= 1

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        """Count into ``phase`` inside, then go back to the phase before."""
        previous, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = previous

    def total(self, phase: str | None = None) -> int:
        """Synchronizing operations counted in ``phase``, or in all phases (None)."""
        phases = [phase] if phase is not None else list(self.counts)
        return sum(sum(self.counts[p].values()) for p in phases if p in self.counts)

    def as_dict(self) -> dict[str, dict[str, int]]:
        """``{phase: {operation: count}}``, JSON-ready."""
        return {phase: dict(ops) for phase, ops in self.counts.items() if ops}
