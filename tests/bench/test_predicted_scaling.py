import pytest
from omegaconf import OmegaConf

from segscale.bench.measure.compute import BareLoopResult
from segscale.bench.measure.timing import Timing
from segscale.bench.predict.host_staged_link import GpuBackend, HostStagedLink, PinnedCopies
from segscale.bench.predict.interconnects import INTERCONNECTS, Interconnect
from segscale.bench.predict.step_profile import Gradients
from segscale.bench.predicted_scaling import ModelInputs, prediction_rows

OPTIONS = OmegaConf.create({"predict_devices": [2, 8]})


def measured(device: str, one_device_s: float | None) -> ModelInputs:
    """What bench measured of one device's 80 ms step of 8 patches (forward : backward 1 : 2)."""
    step = Timing(0.080, (0.080,), 0.0, 0.02, 10)
    bare = BareLoopResult(step, 0.025, 0.050, 0.005, 100.0, 1.0)
    compute = {
        "device": device,
        "batch": 8,
        "overhead": {"overhead_ms": 1.0},
        "batchnorm_layers": 29,
        "batchnorm_channels": 29 * 128,
        "buffer_bytes": 200e3,
    }
    gradients = Gradients.uniform([11e6 * 4 / 4] * 4)
    rates = {1: 1000.0, 2: 1000.0, 8: 1000.0}
    return ModelInputs(bare, step, compute, gradients, rates, None, True, one_device_s)


def test_gpu_predictions_are_built_from_the_gpu_step_and_say_so():
    inputs = measured("NVIDIA H100 80GB HBM3", 0.085)
    prediction = prediction_rows(inputs, OPTIONS, None, [1], on_gpu=True)
    rows = prediction["rows"]
    assert [(r["interconnect"], r["devices"]) for r in rows] == [
        (link.name, n) for link in INTERCONNECTS for n in (2, 8)
    ]
    assert all(0 < r["efficiency"] <= 1 and "other_spread" in r for r in rows)
    assert prediction["gpu_basis"] == {
        "device": "NVIDIA H100 80GB HBM3",
        "step_s": 0.085,
        "step": "the 1-device train.py run's",
    }
    assert prediction["arrival_spread"]["used"]["collective_s"] > 0
    assert prediction["devices"] == [2, 8]
    without_run = prediction_rows(measured("NVIDIA H100", None), OPTIONS, None, [1], True)
    assert without_run["gpu_basis"]["step"] == "bench's own, data in memory"
    assert without_run["gpu_basis"]["step_s"] == pytest.approx(0.080)


def test_a_cpu_step_is_not_scaled_into_gpu_predictions():
    prediction = prediction_rows(measured("CPU (2 cores)", 0.6), OPTIONS, None, [1], False)
    assert prediction["rows"] == [] and prediction["interconnects"] == []
    assert prediction["gpu_basis"] is None and prediction["arrival_spread"] is None
    assert prediction["devices"] == [2, 8]  # the warnings' "on each of 8"


def gloo_link(bandwidth: float = 0.76e9) -> HostStagedLink:
    """gloo's link: a host all-reduce of ``bandwidth`` bus bytes/s, a V100's copies."""
    bucket = 25 * 2**20
    host = Interconnect("gloo (measured)", ((4.0, 1e-4), (bucket, bucket / bandwidth)), "here")
    return HostStagedLink(host, PinnedCopies(11.4e9, 9.6e9, "bandwidthTest"))


WINDOWS = GpuBackend("gloo", "Windows has no NCCL")


def test_under_gloo_the_gpus_are_predicted_through_host_memory_beside_nccl():
    inputs = measured("Tesla V100-PCIE-16GB", 0.085)
    prediction = prediction_rows(inputs, OPTIONS, None, [1], True, WINDOWS, gloo_link())
    assert prediction["gpu_backend"] == {"name": "gloo", "reason": "Windows has no NCCL"}
    gloo = prediction["gloo"]
    assert gloo["link"]["name"] == "gloo through host memory"
    assert [(r["interconnect"], r["devices"]) for r in gloo["rows"]] == [
        ("gloo through host memory", 2),
        ("gloo through host memory", 8),
    ]
    nccl = {(r["interconnect"], r["devices"]): r for r in prediction["rows"]}
    for row in gloo["rows"]:
        assert row["efficiency"] < nccl["PCIe 3.0 x16", row["devices"]]["efficiency"]
        assert row["sync_batchnorm_s"] > nccl["PCIe 3.0 x16", row["devices"]]["sync_batchnorm_s"]
        assert set(row["gloo_parts"]) == {
            "device_to_host_s",
            "host_allreduce_s",
            "host_to_device_s",
        }
        assert row["gloo_parts"]["host_allreduce_s"] > row["gloo_parts"]["device_to_host_s"] > 0
        assert row["without_sync_batchnorm"]["efficiency"] > row["efficiency"]
    # A faster host all-reduce gives a faster gloo step: the rows follow the link.
    faster = prediction_rows(inputs, OPTIONS, None, [1], True, WINDOWS, gloo_link(4e9))
    assert faster["gloo"]["rows"][0]["step_s"] < gloo["rows"][0]["step_s"]


def test_gloo_rows_only_for_gpu_ranks_under_gloo():
    inputs = measured("Tesla V100-PCIE-16GB", 0.085)
    linux = GpuBackend("nccl", "NCCL on Linux")
    nccl = prediction_rows(inputs, OPTIONS, None, [1], True, linux)
    assert nccl["gloo"] is None and nccl["gpu_backend"]["name"] == "nccl"
    cpu = prediction_rows(
        measured("CPU (2 cores)", 0.6), OPTIONS, None, [1], False, WINDOWS, gloo_link()
    )
    assert cpu["gloo"] is None and cpu["gpu_backend"] is None


def test_this_machine_s_gpus_under_gloo_are_predicted_over_its_link():
    inputs = measured("Tesla V100-PCIE-16GB", 0.085)
    link = gloo_link()
    prediction = prediction_rows(inputs, OPTIONS, link, [1, 2], True, WINDOWS, link)
    assert prediction["this_machine"] == "gloo through host memory"
    here = {r["sync_batchnorm"]: r for r in prediction["this_machine_rows"]}
    gloo_2 = prediction["gloo"]["rows"][0]
    assert here[True]["step_s"] == pytest.approx(gloo_2["step_s"])
    assert here[False]["step_s"] < here[True]["step_s"]
