import signal
from types import SimpleNamespace

import pytest

from segscale.training.callbacks.preemption_stop import PreemptionStop
from segscale.training.ranks.preemption import PreemptionSignals
from tests.helpers.distributed import on_two_ranks


def _stop_steps_on_rank(rank: int) -> int:
    """Steps until PreemptionStop's agreement says stop, when rank 1 notes a signal at 2."""
    signals = PreemptionSignals([], 25)
    stop = PreemptionStop(signals, "unused")
    stop.on_train_start(SimpleNamespace(world_size=2), None)
    for step in range(1, 10):
        if rank == 1 and step == 2:
            signals.received = signal.SIGUSR2
        agreed = stop._agreed()
        if agreed:
            return step * 100 + agreed
    return 0


@pytest.mark.slow
def test_the_ranks_agree_on_the_step_to_stop_at():
    stops = on_two_ranks(_stop_steps_on_rank)
    # Noted by rank 1 at step 2 (its flag joins the reduce started then), read at step 3.
    assert stops == {0: 300 + signal.SIGUSR2, 1: 300 + signal.SIGUSR2}
