import json

import pytest

from segscale.training.run import train

# The tiny config trains 2 epochs of 4 iterations each (see tests/conftest.py).


@pytest.mark.parametrize("choice", ["best-validation", "last-iteration"])
def test_output_network_picks_the_reported_checkpoint(make_config, tmp_path, choice):
    summary = train(make_config(f"training.output_network={choice}"))
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    expected = "best.ckpt" if choice == "best-validation" else "last.ckpt"
    assert on_disk["output_network"] == choice
    assert summary["output_checkpoint"].endswith(expected)


def test_the_fine_tuning_settings_are_in_the_summary(make_config):
    summary = train(
        make_config("training.freeze_encoder_epochs=1", "training.encoder_lr_factor=0.1")
    )
    assert summary["fine_tuning"] == {"encoder_lr_factor": 0.1, "freeze_encoder_epochs": 1}
