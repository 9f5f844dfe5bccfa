import sys

import pytest
from omegaconf import OmegaConf

from segscale import devices
from segscale.errors import ConfigError
from segscale.platforms import cores
from tests.helpers.fake_cpus import fake_cgroups, fake_mask, no_launcher, slurm_task


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


@pytest.fixture
def cgroups(monkeypatch, tmp_path):
    """``fake_cgroups`` with its mount under this test's folder."""
    return lambda membership, files: fake_cgroups(monkeypatch, tmp_path / "cg", membership, files)


def test_a_cgroup_v2_quota_limits_the_cores_of_the_mask(cgroups, monkeypatch):
    # docker --cpus=4 on a 64-core host: the mask holds all 64.
    fake_mask(monkeypatch, 64)
    cgroups("0::/\n", {"cpu.max": "400000 100000\n"})
    assert devices.cpus_available() == 4  # for the parallel launcher, bench, the test workers
    assert cores.cpu_quota() == 4.0
    cgroups("0::/\n", {"cpu.max": "max 100000\n"})  # no quota
    assert cores.cpu_quota() is None
    assert devices.cpus_available() == 64


def test_a_cgroup_v1_quota_counts_and_minus_one_is_none(cgroups, monkeypatch):
    fake_mask(monkeypatch, 16)
    # Docker on cgroup v1 mounts the container's own cgroup at the mount's root, where
    # /docker/<id> of /proc/self/cgroup is not a folder: its quota is found there.
    membership = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/docker/abc\n"
    cgroups(membership, {"cpu/cpu.cfs_quota_us": "150000", "cpu/cpu.cfs_period_us": "100000"})
    assert cores.cpu_quota() == 1.5
    assert devices.cpus_available() == 2  # rounded up: the half core is time a thread gets
    cgroups(membership, {"cpu/cpu.cfs_quota_us": "-1"})
    assert cores.cpu_quota() is None and devices.cpus_available() == 16


def test_the_smallest_quota_of_the_cgroup_and_its_ancestors_counts(cgroups, monkeypatch):
    fake_mask(monkeypatch, 64)
    files = {
        "kubepods/cpu.max": "max 100000",
        "kubepods/pod1/cpu.max": "300000 100000",  # the pod's limit
        "kubepods/pod1/c1/cpu.max": "max 100000",  # the container sets none of its own
    }
    cgroups("0::/kubepods/pod1/c1\n", files)
    assert cores.cpu_quota() == 3.0
    cgroups("0::/kubepods/pod1/c1\n", files | {"kubepods/pod1/c1/cpu.max": "800000 100000"})
    assert cores.cpu_quota() == 3.0
    cgroups("0::/kubepods/pod1/c1\n", files | {"kubepods/pod1/c1/cpu.max": "150000 100000"})
    assert cores.cpu_quota() == 1.5


def test_a_quota_below_one_core_still_leaves_one(cgroups, monkeypatch):
    fake_mask(monkeypatch, 8)
    cgroups("0::/\n", {"cpu.max": "20000 100000"})
    assert cores.cpu_quota() == pytest.approx(0.2)
    assert devices.cpus_available() == 1


@pytest.mark.parametrize(
    ("membership", "files"),
    [
        ("0::/../outside\n", {"outside/cpu.max": "100000 100000"}),  # not in this namespace
        ("0::/a\n", {"a/cpu.max": "-100000 100000"}),  # not the kernel's form
        ("0::/a\n", {"a/cpu.max": "100000"}),
        ("0::/a\n", {"a/cpu.max": "1e5 100000"}),
        ("0::/a\n", {"a/cpu.max": "0 100000"}),
        ("0::/a\n", {"a/cpu.max": "100000 0"}),
        ("0::a\n", {"a/cpu.max": "100000 100000"}),  # a path not from the root
        ("1:cpuacct:/a\n", {"cpu/a/cpu.cfs_quota_us": "1", "cpu/a/cpu.cfs_period_us": "1"}),
        ("1:name=cpu:/\n", {"cpu/cpu.cfs_quota_us": "1", "cpu/cpu.cfs_period_us": "1"}),
        ("x:cpu:/\n", {"cpu/cpu.cfs_quota_us": "1", "cpu/cpu.cfs_period_us": "1"}),
        ("1::/a\n", {"a/cpu.max": "100000 100000"}),  # v2 is hierarchy 0
        ("0::/a\n", {"a/cpu.max/x": "a folder, not a file"}),
    ],
)
def test_what_is_not_a_quota_of_this_process_limits_nothing(
    cgroups, monkeypatch, membership, files
):
    fake_mask(monkeypatch, 8)
    cgroups(membership, files)
    assert cores.cpu_quota() is None
    assert devices.cpus_available() == 8


def test_without_cgroups_the_mask_is_all(monkeypatch, tmp_path):
    fake_mask(monkeypatch, 6)
    monkeypatch.setattr(cores, "CGROUP_MEMBERSHIP", tmp_path / "absent")  # not Linux
    assert cores.cpu_quota() is None and devices.cpus_available() == 6


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
