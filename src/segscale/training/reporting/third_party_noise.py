"""Lightning's advertising tips and known third-party deprecation warnings, kept out of a run.

A run's output should hold what the user can act on: the scaling, the threads, the data
check, the verbose table. Lightning 2.6 adds an advertisement for its cloud products
(``💡 Tip: ...``) to every ``Trainer``, and its ``CombinedLoader`` builds a
``torch.utils._pytree.LeafSpec``, which PyTorch deprecates with a ``FutureWarning``
that names Lightning's file, not ours. Neither says anything about the run, and the
user can do nothing about either. ``third_party_noise_filtered`` drops exactly these
(by logger and message; by category, message and module) for the duration of one
training; every other warning and Lightning message still reaches the user. Ranks
that ``ddp_spawn`` starts do not inherit the warning filters of the process that
starts them: ``ThirdPartyNoiseFilter``, a callback, filters in each of them.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import lightning as L

LIGHTNING_INFO_LOGGER = "lightning.pytorch.utilities.rank_zero"
"""The logger of Lightning's ``rank_zero_info``, which prints the tips."""

TIP_PREFIX = "💡 Tip:"
"""How Lightning's advertisements start (litlogger at ``Trainer(...)``, litmodels at
``fit`` when Lightning adds its own ``ModelCheckpoint``). Lightning offers no switch for
them: Lightning-AI/pytorch-lightning#21294."""

KNOWN_DEPRECATIONS: tuple[tuple[type[Warning], str, str], ...] = (
    # Lightning's CombinedLoader (lightning/pytorch/utilities/_pytree.py) calls LeafSpec(),
    # which PyTorch deprecates; Lightning-AI/pytorch-lightning#21326.
    (
        FutureWarning,
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        r"lightning\.pytorch\.utilities\._pytree\Z",
    ),
)
"""``(category, message regex, module regex)`` of each third-party warning filtered out."""


class WithoutTips(logging.Filter):
    """A logging filter that drops Lightning's advertising tips and keeps everything else."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is kept: every record but a tip."""
        return not record.getMessage().startswith(TIP_PREFIX)


@contextmanager
def third_party_noise_filtered() -> Iterator[None]:
    """Within the block, Lightning's tips and ``KNOWN_DEPRECATIONS`` are not shown.

    Wrap the construction of the ``Trainer`` and its ``fit``: the tips come from both.
    The warning filters are this block's own (``warnings.catch_warnings``) and the
    logging filter is removed on leaving, so the process is left as it was.
    """
    logger = logging.getLogger(LIGHTNING_INFO_LOGGER)
    tips = WithoutTips()
    logger.addFilter(tips)
    try:
        with warnings.catch_warnings():
            for category, message, module in KNOWN_DEPRECATIONS:
                warnings.filterwarnings("ignore", message, category, module)
            yield
    finally:
        logger.removeFilter(tips)


class ThirdPartyNoiseFilter(L.Callback):
    """``third_party_noise_filtered`` in every process of a fit, from setup to teardown.

    For the ranks ``ddp_spawn`` starts, which inherit no warning filters: the
    ``CombinedLoader`` is built after ``setup``. In the process that builds the trainer
    it nests within that process's own ``third_party_noise_filtered``.
    """

    def __init__(self) -> None:
        self._filters: ExitStack | None = None  # set in setup: the callback is pickled to ranks

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Start filtering in this process."""
        self._filters = ExitStack()
        self._filters.enter_context(third_party_noise_filtered())

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Stop filtering (the process is as it was before ``setup``)."""
        self._close()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Stop filtering: Lightning calls no ``teardown`` after an exception."""
        self._close()

    def _close(self) -> None:
        if self._filters is not None:
            self._filters.close()
            self._filters = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (to the ranks ``ddp_spawn`` starts) without the filters of this process."""
        return {**self.__dict__, "_filters": None}
