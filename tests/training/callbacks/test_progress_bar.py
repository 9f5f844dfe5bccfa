from segscale.training.callbacks.progress_bar import TQDMProgressBar
from tests.training.callbacks.scheduled_fit import scheduled_fit


def test_the_bar_shows_the_training_loss_of_the_last_logging_step(tmp_path):
    bar = TQDMProgressBar(refresh_rate=1)
    trainer = scheduled_fit(tmp_path, bar)
    shown = bar.get_metrics(trainer, trainer.lightning_module)
    assert shown["train/loss"] == float(trainer.callback_metrics["train/loss"])
    assert next(iter(shown)) == "train/loss"
