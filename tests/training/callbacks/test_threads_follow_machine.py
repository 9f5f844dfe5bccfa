import logging
from types import SimpleNamespace

import pytest
import torch

from segscale.devices import CoreShare
from segscale.training.callbacks import threads_follow_machine
from segscale.training.callbacks.threads_follow_machine import ThreadsFollowMachine
from segscale.training.ranks.threads import CoreTimes, MachineShare

TRAINER = SimpleNamespace(global_rank=0, world_size=1)


class Machine:
    """A 4-core machine whose other processes keep ``others`` cores busy, 10 s a look."""

    def __init__(self, monkeypatch):
        self.now, self.busy, self.total, self.reads = 0.0, 0.0, 0.0, 0
        self.others = 0.0
        monkeypatch.setattr(threads_follow_machine, "core_times", self.read)
        monkeypatch.setattr(threads_follow_machine.platform_cores, "affinity", lambda: {0, 1, 2, 3})

    def read(self, cores, workers):
        self.reads += 1
        return CoreTimes(self.busy, self.total, own=0.0)

    def clock(self):
        return self.now

    def run(self, seconds, others):
        """``seconds`` pass with ``others`` cores busy."""
        self.now += seconds
        self.total += 4 * seconds
        self.busy += others * seconds


@pytest.fixture
def threads(monkeypatch):
    """torch's thread count, recorded rather than set: the test process keeps its own."""
    state = {"count": 4, "set": []}
    monkeypatch.setattr(torch, "get_num_threads", lambda: state["count"])

    def set_threads(count):
        state["count"] = count
        state["set"].append(count)

    monkeypatch.setattr(torch, "set_num_threads", set_threads)
    return state


def started(machine, every_s=30.0):
    share = MachineShare(mask=4, quota=None, share=CoreShare(1), workers_per_rank=2)
    callback = ThreadsFollowMachine(share, 4, every_s=every_s, clock=machine.clock)
    callback.on_train_start(TRAINER, None)
    return callback


def looks(callback, machine, busy_per_look):
    for others in busy_per_look:
        machine.run(10.0, others)
        callback.on_train_epoch_start(TRAINER, None)


def test_the_threads_follow_a_machine_that_fills_and_frees_after_two_looks(
    monkeypatch, threads, caplog
):
    caplog.set_level(logging.INFO, logger=threads_follow_machine.__name__)
    machine = Machine(monkeypatch)
    callback = started(machine)
    looks(callback, machine, [2.0])
    assert threads["set"] == []  # seen once: not yet
    looks(callback, machine, [2.0])
    assert threads["set"] == [2] and callback.count == 2
    looks(callback, machine, [0.0, 0.0])  # the neighbour is gone
    assert threads["set"] == [2, 4]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "threads: 4 -> 2 per training process (busy cores seen: 2.0 of 4 with other "
        "processes, on two looks in a row; training.threads=auto)",
        "threads: 2 -> 4 per training process (busy cores seen: 0.0 of 4 with other "
        "processes, on two looks in a row; training.threads=auto)",
    ]


def test_a_passing_burst_changes_nothing(monkeypatch, threads, caplog):
    caplog.set_level(logging.INFO, logger=threads_follow_machine.__name__)
    machine = Machine(monkeypatch)
    callback = started(machine)
    looks(callback, machine, [3.0, 0.0, 2.0, 0.0, 3.0, 0.2, 1.8, 0.0])  # never twice alike
    assert threads["set"] == [] and callback.count == 4 and not caplog.records
    looks(callback, machine, [3.0, 2.6])  # 3 cores on both looks: one thread
    assert threads["set"] == [1]


def test_the_runs_own_time_is_not_a_neighbour(monkeypatch, threads):
    # Both ranks of the node (and their workers) keep 3.6 cores busy: this rank's own
    # reading holds 1.8 of them; taken twice, nothing else is left.
    machine = Machine(monkeypatch)
    own = {"seconds": 0.0}
    monkeypatch.setattr(
        threads_follow_machine,
        "core_times",
        lambda cores, workers: CoreTimes(machine.busy, machine.total, own["seconds"]),
    )
    share = MachineShare(mask=4, quota=None, share=CoreShare(2), workers_per_rank=1)
    callback = ThreadsFollowMachine(share, 2, clock=machine.clock)
    callback.on_train_start(TRAINER, None)
    threads["count"] = 2
    callback.count = 2
    for _ in range(3):
        machine.run(10.0, 3.6)
        own["seconds"] += 18.0
        callback.on_train_epoch_start(TRAINER, None)
    assert threads["set"] == []


def test_a_look_too_soon_waits_for_a_longer_interval(monkeypatch, threads):
    machine = Machine(monkeypatch)
    callback = started(machine)
    machine.run(0.5, 3.0)
    callback.look(TRAINER)
    assert machine.reads == 1  # the start's only
    machine.run(10.0, 3.0)
    callback.look(TRAINER)
    assert machine.reads == 2


def test_looks_come_every_few_seconds_and_sooner_when_the_step_time_drifts(monkeypatch, threads):
    machine = Machine(monkeypatch)
    callback = started(machine, every_s=100.0)
    for _ in range(10):  # 1 s steps: no look before 100 s
        machine.run(1.0, 0.0)
        callback.on_train_batch_end(TRAINER, None, None, None, 0)
    assert machine.reads == 1
    callback.look(TRAINER)  # an epoch's start: the interval's step time is 1 s
    assert machine.reads == 2
    for _ in range(5):  # the same pace: no look
        machine.run(1.0, 0.0)
        callback.on_train_batch_end(TRAINER, None, None, None, 0)
    assert machine.reads == 2
    callback.look(TRAINER)
    for _ in range(5):  # twice as slow: the fifth step looks
        machine.run(2.0, 0.0)
        callback.on_train_batch_end(TRAINER, None, None, None, 0)
    assert machine.reads == 4
    for _ in range(60):  # at the pace of the last interval: the next look at 100 s
        machine.run(2.0, 0.0)
        callback.on_train_batch_end(TRAINER, None, None, None, 0)
    assert machine.reads == 5


def test_ranks_of_a_job_say_which_rank_changed(monkeypatch, threads, caplog):
    caplog.set_level(logging.INFO, logger=threads_follow_machine.__name__)
    machine = Machine(monkeypatch)
    callback = started(machine)
    rank_1 = SimpleNamespace(global_rank=1, world_size=2)
    for _ in range(2):
        machine.run(10.0, 1.0)
        callback.look(rank_1)
    assert [r.getMessage()[:37] for r in caplog.records] == [
        "rank 1: threads: 4 -> 3 per training "
    ]


def _fit_recording_threads(monkeypatch, make_config, *overrides):
    """Train the tiny config on a 2-core machine that frees at once; the threads set."""
    from segscale.training.ranks import threads as rank_threads
    from segscale.training.run.training_run import train
    from tests.helpers.fake_cpus import fake_mask, no_launcher

    no_launcher(monkeypatch)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    fake_mask(monkeypatch, 2)
    monkeypatch.setattr(rank_threads, "busy_cores", lambda: 1.0)  # busy at the start
    monkeypatch.setattr(threads_follow_machine, "MIN_INTERVAL_S", 0.0)
    seconds = {"total": 0.0}

    def free_machine(cores, workers):
        seconds["total"] += 20.0
        return CoreTimes(0.0, seconds["total"], 0.0)

    monkeypatch.setattr(threads_follow_machine, "core_times", free_machine)
    calls, real = [], torch.set_num_threads

    def recorded(count):
        calls.append(count)
        real(count)

    monkeypatch.setattr(torch, "set_num_threads", recorded)
    before = torch.get_num_threads()
    train(make_config(*overrides))  # 2 epochs: a look at each one's start
    assert calls[-1] == before  # restored after the run
    return calls[:-1]


@pytest.mark.slow  # two tiny runs
def test_auto_follows_the_machine_in_a_run_and_a_number_is_kept(
    make_config, monkeypatch, caplog, tmp_path
):
    caplog.set_level(logging.INFO, logger=threads_follow_machine.__name__)
    assert _fit_recording_threads(monkeypatch, make_config) == [1, 2]
    changes = [r.getMessage() for r in caplog.records if r.name == threads_follow_machine.__name__]
    assert [line[:43] for line in changes] == ["threads: 1 -> 2 per training process (busy "]
    caplog.clear()
    assert _fit_recording_threads(
        monkeypatch, make_config, "training.threads=1", f"output_dir={tmp_path / 'fixed'}"
    ) == [1]
    assert not [r for r in caplog.records if r.name == threads_follow_machine.__name__]
