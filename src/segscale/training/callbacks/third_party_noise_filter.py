"""Third-party noise filtered in every process of a fit, the ranks ``ddp_spawn`` starts too."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import lightning as L

from segscale.training.reporting.third_party_noise import third_party_noise_filtered


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
