from types import SimpleNamespace

import pytest
import torch

from segscale.training.callbacks.learning_rate import ApplyLearningRate, LearningRateMonitor
from tests.training.callbacks.scheduled_fit import scheduled_fit


def _optimizer_and_schedule(rates: list[float]) -> tuple:
    """SGD with one parameter group per rate, its rate halved every step (LambdaLR)."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": rate} for rate in rates]
    for group in groups:
        group["params"][0].grad = torch.ones(1)
    optimizer = torch.optim.SGD(groups, lr=rates[0], momentum=0.9)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)


def test_a_learning_rate_given_on_resume_replaces_the_restored_one_at_its_step():
    saved, saved_schedule = _optimizer_and_schedule([0.1, 0.05])  # encoder at half the rate
    for _ in range(2):
        saved.step()
        saved_schedule.step()
    optimizer, schedule = _optimizer_and_schedule([1.0, 0.5])  # this launch: a new optimizer.lr
    trainer = SimpleNamespace(
        optimizers=[optimizer],
        lr_scheduler_configs=[SimpleNamespace(scheduler=schedule)],
        is_global_zero=True,
    )
    callback = ApplyLearningRate()
    callback.on_fit_start(trainer, None)
    optimizer.load_state_dict(saved.state_dict())  # as Lightning restores them
    schedule.load_state_dict(saved_schedule.state_dict())
    callback.on_train_start(trainer, None)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.25, 0.125])
    assert [g["initial_lr"] for g in optimizer.param_groups] == [1.0, 0.5]
    assert schedule.get_last_lr() == pytest.approx([0.25, 0.125])
    assert "momentum_buffer" in optimizer.state[optimizer.param_groups[0]["params"][0]]
    optimizer.step()
    schedule.step()  # the schedule goes on from its step, with the new base rates
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.125, 0.0625])


def test_without_a_logger_the_monitor_stays_idle(tmp_path):
    monitor = LearningRateMonitor(logging_interval="step")  # Lightning's refuses to train
    trainer = scheduled_fit(tmp_path, monitor, logger=False)
    assert trainer.global_step == 3 and "lr-SGD" not in trainer.callback_metrics


def test_with_a_logger_it_logs_the_rate_of_every_step(tmp_path):
    scheduled_fit(tmp_path, LearningRateMonitor(logging_interval="step"))
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    column = rows[0].split(",").index("lr-SGD")
    rates = [float(r.split(",")[column]) for r in rows[1:] if r.split(",")[column]]
    assert rates == [0.03, 0.02, 0.01]
