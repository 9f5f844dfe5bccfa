import pytest

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
