import logging
import threading

from segscale.training.reporting.background_figures import BackgroundFigures


def test_a_figure_is_drawn_on_another_thread_and_wait_returns_once_it_is_written(tmp_path):
    figures, release, threads = BackgroundFigures(), threading.Event(), []
    path = tmp_path / "figure.png"

    def write():
        threads.append(threading.current_thread())
        release.wait(10)
        path.write_bytes(b"png")

    figures.draw(path, write)  # returns while the figure is still being drawn
    assert not path.exists()
    release.set()
    figures.close()
    assert path.read_bytes() == b"png" and threads[0] is not threading.main_thread()


def test_a_figure_that_fails_is_logged_and_the_others_are_still_drawn(tmp_path, caplog):
    figures, order = BackgroundFigures(), []

    def fail():
        raise ValueError("no such colour")

    with caplog.at_level(logging.ERROR, logger="segscale"):
        figures.draw(tmp_path / "a.png", lambda: order.append("a"))
        figures.draw(tmp_path / "b.png", fail)
        figures.draw(tmp_path / "c.png", lambda: order.append("c"))
        figures.close()
    assert order == ["a", "c"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [f"could not draw {tmp_path / 'b.png'}: ValueError: no such colour"]
