import sys

import pytest
from omegaconf import OmegaConf

from segscale import devices
from segscale.errors import ConfigError
from tests.helpers.fake_cpus import no_launcher, slurm_task


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


def test_ranks_share_the_cores_their_launcher_gave_them_all(monkeypatch):
    no_launcher(monkeypatch)  # segscale's own rank 0, ddp_spawn
    assert devices.core_share(4) == devices.CoreShare(4)
    assert devices.core_share(4).of(16) == 4
    monkeypatch.setenv("LOCAL_RANK", "1")  # torchrun's, or one segscale started
    assert devices.core_share(4).of(16) == 4
    monkeypatch.setenv("SLURM_LOCALID", "0")  # torchrun inside one SLURM task per node
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "16")
    assert devices.core_share(4).of(16) == 4
    assert devices.core_share(0).of(16) == 16  # never divided by nothing


def test_a_slurm_task_keeps_the_cores_slurm_granted_it(monkeypatch):
    slurm_task(monkeypatch, 2, tasks=4, cpus="8")
    share = devices.core_share(4)
    assert share.of(8) == 8  # its own 8-core mask, not divided by the 4 tasks
    assert share.of(64) == 8  # tasks not bound to their cores: the grant still holds
    assert share.of(6) == 6
    assert "SLURM_CPUS_PER_TASK=8" in share.describe()
    slurm_task(monkeypatch, 2, tasks=4, cpus=None)
    assert devices.core_share(4).of(8) == 8
    for malformed in ("", "eight", "-8", "0", "8(x2)"):
        slurm_task(monkeypatch, 2, tasks=4, cpus=malformed)
        assert devices.core_share(4) == devices.CoreShare(1, None, slurm_task=True)
    slurm_task(monkeypatch, 0, tasks=1, cpus="8")  # one task: it starts the ranks itself
    assert devices.core_share(4).of(32) == 8


BACKEND_KEY = "strategy.process_group_backend"


@pytest.mark.parametrize(
    ("platform", "accelerator", "backend"),
    [
        ("linux", "gpu", "nccl"),
        ("linux", "cuda", "nccl"),
        ("linux", "cpu", "gloo"),
        ("darwin", "gpu", "gloo"),
        ("darwin", "mps", "gloo"),
        ("darwin", "cpu", "gloo"),
        ("win32", "gpu", "gloo"),
        ("win32", "cpu", "gloo"),
    ],
)
def test_null_is_the_platforms_backend_for_the_accelerator(
    platform, accelerator, backend, monkeypatch
):
    monkeypatch.setattr(sys, "platform", platform)
    assert devices.process_group_backend(None, accelerator, BACKEND_KEY) == backend


@pytest.mark.parametrize(("platform", "backend"), [("linux", "nccl"), ("win32", "gloo")])
def test_accelerator_auto_takes_the_backend_of_the_device_it_picks(platform, backend, monkeypatch):
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: True)
    assert devices.process_group_backend(None, "auto", BACKEND_KEY) == backend
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices.torch.backends.mps, "is_available", lambda: False)
    assert devices.process_group_backend(None, "auto", BACKEND_KEY) == "gloo"


def test_a_backend_the_platform_lacks_is_a_config_error_naming_key_platform_and_what_it_has(
    monkeypatch,
):
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(ConfigError) as refused:
        devices.process_group_backend("nccl", "gpu", BACKEND_KEY)
    assert str(refused.value).startswith(
        "strategy.process_group_backend='nccl' is not allowed: Windows has no NCCL "
    )
    assert "have gloo (null picks gloo)" in str(refused.value)
    monkeypatch.setattr(sys, "platform", "linux")
    with pytest.raises(ConfigError, match=r"^process_group_backend='NCCL' is not allowed: not a"):
        devices.process_group_backend("NCCL", "gpu", "process_group_backend")
