import matplotlib.pyplot as plt
import numpy as np
import pytest

from segscale.training.reporting.plots import (
    IGNORED_COLOUR,
    IGNORED_HATCH,
    IGNORED_LABEL,
    SamplePrediction,
    TrainingPosition,
    colour_labels,
    sample_predictions_figure,
    training_progress_figure,
)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_the_progress_title_and_axis_reach_the_last_iteration_not_the_last_logged():
    train = [(50 * k, 1.0 / k, 0.5, 0.1) for k in range(1, 4)]  # logged up to 150
    position = TrainingPosition(184, 184, 2, 2)
    figure = training_progress_figure(train, [(92, 0.9, 0.6, 0.3)], position)
    assert figure.texts[0].get_text() == "Training progress — iteration 184 of 184, epoch 2 of 2"
    assert figure.axes[0].get_xlim()[1] >= 184
    assert TrainingPosition(7).describe() == "iteration 7"  # totals unknown: left out


def test_ignored_pixels_are_grey_hatched_and_named_in_the_legend():
    truth = np.array([[0, 1], [255, 1]], np.uint8)
    colours = np.array([[0, 0, 0], [255, 0, 0]], np.uint8)  # class 0 black, as ignored was
    rgb = colour_labels(truth, colours, 255)
    assert tuple(rgb[1, 0]) == IGNORED_COLOUR and tuple(rgb[0, 0]) == (0, 0, 0)
    sample = SamplePrediction(np.zeros((2, 2, 3), np.uint8), truth, truth.clip(0, 1), "tile")
    figure = sample_predictions_figure([sample], ["road", "car"], colours, 255, "title")
    legend = figure.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["road", "car", IGNORED_LABEL]
    assert legend.get_patches()[-1].get_hatch() == IGNORED_HATCH
    truth_axis, prediction_axis = figure.axes[1:3]
    for axis in (truth_axis, prediction_axis):  # hatched in both: not scored
        assert [c.hatches for c in axis.collections] == [[IGNORED_HATCH]]
