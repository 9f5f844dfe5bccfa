from segscale.training.plots import plot_training_progress
from segscale.training.run import train

# The tiny config trains 2 epochs of 4 iterations each (see tests/conftest.py).


def test_training_progress_png_is_drawn_and_updated(make_config, tmp_path):
    train(make_config())
    png = tmp_path / "run" / "training_progress.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = png.read_bytes()
    plot_training_progress([(1, 1.0, 0.5, 0.1), (2, 0.8, 0.6, 0.1)], [(2, 0.9, 0.55, 0.3)], png)
    assert png.read_bytes() != first
    assert [p.name for p in png.parent.glob(".*.png")] == []  # no temporary left


def test_the_progress_plot_is_redrawn_at_every_validation(make_config, monkeypatch):
    from segscale.training.callbacks import progress_plot

    drawn = []
    original = progress_plot.plot_training_progress

    def counting(train_rows, val_rows, path):
        drawn.append((len(train_rows), len(val_rows)))
        original(train_rows, val_rows, path)

    monkeypatch.setattr(progress_plot, "plot_training_progress", counting)
    train(make_config("trainer.val_check_interval=2", "trainer.check_val_every_n_epoch=null"))
    # 8 iterations, a validation every 2: four redraws, each with the curves so far.
    assert drawn == [(2, 1), (4, 2), (6, 3), (8, 4)]
