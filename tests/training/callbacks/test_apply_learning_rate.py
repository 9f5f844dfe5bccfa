from types import SimpleNamespace

import pytest
import torch

from segscale.training.callbacks.apply_learning_rate import ApplyLearningRate


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
