import matplotlib.pyplot as plt
import numpy as np
import pytest

from segscale.training.reporting.plots import (
    CONFUSION_UNIT,
    IGNORED_COLOUR,
    IGNORED_HATCH,
    IGNORED_LABEL,
    SamplePrediction,
    TrainingPosition,
    colour_labels,
    confusion_matrix_figure,
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


def test_confusion_cells_colour_bar_and_title_share_one_percent_unit():
    confusion = np.array([[3, 1, 0], [0, 0, 0], [0, 2, 2]])  # rows: true class
    figure = confusion_matrix_figure(confusion, ["a", "b", "c"], "Validation at iteration 9")
    axis, bar = figure.axes
    cells = [t.get_text() for t in axis.texts]
    assert cells == ["75.0", "25.0", "0.0", "–", "–", "–", "0.0", "50.0", "50.0"]
    assert axis.images[0].get_clim() == (0, 100)
    assert bar.get_ylabel() == CONFUSION_UNIT == "% of the true class's pixels"
    assert axis.get_title().startswith("Validation at iteration 9") and "%" in axis.get_title()
    assert (axis.get_xlabel(), axis.get_ylabel()) == ("Predicted class", "True class (its pixels)")
    assert [t.get_text() for t in axis.get_yticklabels()] == ["a (4 px)", "b (0 px)", "c (4 px)"]


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
