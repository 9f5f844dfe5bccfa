import pytest
from omegaconf import OmegaConf

from segscale import devices
from segscale.errors import ConfigError


def test_a_gpu_asked_for_where_none_is_visible_is_said_so_with_the_cpu_way(monkeypatch):
    monkeypatch.setattr(devices.torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError) as refused:
        devices.check_devices(1, "gpu")
    message = str(refused.value)
    assert message.startswith("trainer.accelerator=gpu: no GPU is visible to this process")
    assert "CUDA_VISIBLE_DEVICES=" in message and "give trainer.accelerator=cpu" in message
    assert "trainer.devices" not in message and "0..-1" not in message


def test_included_devices_drop_the_weight_zero_positions():
    assert devices.included_devices([0, 2, 3], "gpu", 3, (0, 2)) == [0, 3]
    assert devices.included_devices(3, "gpu", 3, (1, 2)) == [1, 2]
    assert devices.included_devices(3, "cpu", 3, (0, 2)) == 2
    assert devices.included_devices([1, 4], "gpu", 2, (0, 1)) == [1, 4]


def test_device_indices_must_exist(monkeypatch):
    with pytest.raises(ConfigError, match=r"trainer\.devices=\[0, 2\] lists device indices"):
        devices.check_devices(OmegaConf.create([0, 2]), "cpu")
    devices.check_devices(2, "cpu")
    monkeypatch.setattr(devices, "resolve_accelerator", lambda accelerator: "cuda")
    monkeypatch.setattr(devices.torch.cuda, "device_count", lambda: 2)
    devices.check_devices([0, 1], "gpu")
    with pytest.raises(ConfigError, match=r"trainer\.devices=\[0, 2\] asks for GPU.*has 2"):
        devices.check_devices(OmegaConf.create([0, 2]), "gpu")
    with pytest.raises(ConfigError, match=r"trainer\.devices=4 asks for GPU"):
        devices.check_devices(4, "gpu")
