import csv

from segscale.training.reporting.plots import plot_training_progress
from segscale.training.run.training_run import train

# The tiny config trains 2 epochs of 4 iterations each (see tests/conftest.py).


def test_training_progress_png_is_drawn_and_updated(tiny_run):
    png = tiny_run / "training_progress.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = png.read_bytes()
    plot_training_progress([(1, 1.0, 0.5, 0.1), (2, 0.8, 0.6, 0.1)], [(2, 0.9, 0.55, 0.3)], png)
    assert png.read_bytes() != first
    assert [p.name for p in png.parent.glob(".*.png")] == []  # no temporary left


def test_the_progress_plot_is_redrawn_at_every_validation_and_ends_at_the_last_iteration(
    make_config, monkeypatch, tmp_path
):
    from segscale.training.callbacks import progress_plot

    drawn, rates = [], []
    original = progress_plot.plot_training_progress

    def counting(train_rows, val_rows, path, position, batch):
        drawn.append((len(train_rows), len(val_rows), position.describe()))
        rates[:] = [(step, rate) for step, _, _, rate in train_rows]
        original(train_rows, val_rows, path, position, batch)

    monkeypatch.setattr(progress_plot, "plot_training_progress", counting)
    train(
        make_config(
            "trainer.val_check_interval=3",
            "trainer.check_val_every_n_epoch=null",
            "trainer.log_every_n_steps=3",
        )
    )
    # 8 iterations, logged and validated every 3: a redraw at each validation with the
    # curves so far, and a last one at iteration 8, past the last logged and validated.
    assert drawn == [
        (1, 1, "iteration 3 of 8, epoch 1 of 2"),
        (2, 2, "iteration 6 of 8, epoch 2 of 2"),
        (2, 2, "iteration 8 of 8, epoch 2 of 2"),
    ]
    # Each iteration's learning rate is the one it trained with, as the csv logs it
    # (at the 0-based step before it), not the next one the scheduler has set.
    with open(tmp_path / "run" / "metrics.csv") as stream:
        logged = {
            int(r["step"]) + 1: float(r["lr-SGD"]) for r in csv.DictReader(stream) if r["lr-SGD"]
        }
    assert rates == [(3, logged[3]), (6, logged[6])]
