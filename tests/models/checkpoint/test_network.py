from pathlib import Path

import pytest
import torch
from torch import nn

from segscale.errors import ConfigError
from segscale.models.checkpoint import network
from segscale.models.checkpoint.network import (
    BUILD_NETWORK,
    load_network_weights,
    network_from_record,
)
from segscale.models.networks import build_network
from segscale.models.weights import compare_state
from tests.conftest import SEGSCALE_BUILDERS


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


@pytest.fixture
def segscale_builders(monkeypatch):
    """The builders segscale accepts, without the oracle's the session adds."""
    monkeypatch.setattr(network, "BUILDERS", SEGSCALE_BUILDERS)


@pytest.mark.parametrize(
    "target",
    [
        "os.system",
        # modules of torch that build and load, but are no segmentation network
        "torch.nn.Identity",
        "torch.nn.Conv2d",
        "torch.nn.Sequential",
        # through the prefixes of allowed names, to something that is not a network builder
        "torch.nn.modules.module.torch.load",
        "torch.nn.functional.relu",
        "torch.nn.init",
        "torch.nn.Parameter",
        "segscale.models.networks.build_network.__globals__",
        "segscale.models.networks.torch.load",
        "segscale.models.networks.architecture",
        # the allowed name, spelled otherwise
        " segscale.models.networks.build_network",
        "segscale.models.networks.build_network ",
        "segscale.models.networks.BUILD_NETWORK",
        "segscale.models.networks.Build_Network",
        "segscale.models.networks:build_network",
        "tests.conftest.oracle_network",  # the tests' own, which segscale never accepts
        None,
        ["segscale.models.networks.build_network"],
        {"segscale.models.networks.build_network": 1},
    ],
)
def test_a_record_that_names_anything_but_segscale_s_builders_is_refused(segscale_builders, target):
    with pytest.raises(ConfigError) as refused:
        network_from_record({"_target_": target}, Path("x.ckpt"), "ckpt")
    assert str(refused.value).startswith(
        f"ckpt='x.ckpt': its segscale.model._target_={target!r} is not a network segscale "
        f"builds; expected {BUILD_NETWORK}, as train.py writes"
    )


def test_segscale_s_builder_builds():
    assert dict(SEGSCALE_BUILDERS) == {BUILD_NETWORK: build_network}
    smp_network = network_from_record({"_target_": BUILD_NETWORK}, Path("x.ckpt"), "ckpt")
    assert isinstance(smp_network, nn.Module)
