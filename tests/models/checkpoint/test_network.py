from pathlib import Path

import pytest
import torch
from torch import nn

from segscale.errors import ConfigError
from segscale.models.checkpoint.network import (
    BUILD_NETWORK,
    load_network_weights,
    network_from_record,
)
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


@pytest.mark.parametrize(
    "target",
    [
        "os.system",
        # through the allowed prefixes, to something that is not a module class
        "torch.nn.modules.module.torch.load",
        "torch.nn.functional.relu",
        "torch.nn.init",
        "torch.nn.parameter.Parameter",
        "torch.nn.Parameter",
        "segscale.models.networks.build_network.__globals__",
        "segscale.models.networks.torch.load",
        # the allowed name, spelled otherwise
        " segscale.models.networks.build_network",
        "segscale.models.networks.build_network ",
        "segscale.models.networks.BUILD_NETWORK",
        "torch.nn.conv2d",
        None,
        ["segscale.models.networks.build_network"],
    ],
)
def test_a_record_that_names_anything_but_the_allowed_builders_is_refused(target):
    with pytest.raises(ConfigError, match=r"ckpt='x\.ckpt': its network config names _target_="):
        network_from_record({"_target_": target}, Path("x.ckpt"), "ckpt")


def test_the_allowed_builders_build():
    smp_network = network_from_record({"_target_": BUILD_NETWORK}, Path("x.ckpt"), "ckpt")
    assert isinstance(smp_network, nn.Module)
    conv = {"_target_": "torch.nn.Conv2d", "in_channels": 1, "out_channels": 2, "kernel_size": 1}
    assert isinstance(network_from_record(conv, Path("x.ckpt"), "ckpt"), nn.Conv2d)
