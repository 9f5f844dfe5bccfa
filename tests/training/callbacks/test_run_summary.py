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
