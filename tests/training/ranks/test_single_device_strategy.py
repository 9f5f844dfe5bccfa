import pytest
import torch
from omegaconf import OmegaConf

from segscale.errors import ConfigError
from segscale.training.ranks.single_device_strategy import single_device_strategy


def test_single_device_strategy_refuses_several_devices():
    assert single_device_strategy("cpu", 1).root_device == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"trainer\.devices=2.*use strategy=ddp"):
        single_device_strategy("cpu", 2)
    with pytest.raises(ConfigError, match=r"trainer\.devices=\[0, 1\].*use strategy=ddp"):
        single_device_strategy("cpu", OmegaConf.create([0, 1]))
