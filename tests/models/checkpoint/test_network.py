import pytest
import torch

from segscale.errors import ConfigError
from segscale.models.checkpoint.network import load_network_weights
from segscale.models.weights import compare_state


def test_missing_keys_are_listed():
    network = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.BatchNorm2d(2))
    state = dict(network.state_dict())
    del state["1.running_var"]
    state["2.weight"] = torch.zeros(1)
    mismatch = compare_state(network.state_dict(), state)
    assert mismatch.missing == ("1.running_var",)
    assert mismatch.unexpected == ("2.weight",)
    with pytest.raises(
        ConfigError,
        match=r"ckpt='x\.ckpt' does not fit the network \(Sequential\): "
        r"1 missing: 1\.running_var; 1 unexpected: 2\.weight",
    ):
        load_network_weights(network, state, "x.ckpt", "ckpt")
