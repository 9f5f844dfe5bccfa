from segscale.training.callbacks.learning_rate_monitor import LearningRateMonitor
from tests.helpers.scheduled_fit import scheduled_fit


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
