import pytest
from omegaconf import OmegaConf

from segscale.bench.compute import BareLoopResult
from segscale.bench.interconnects import INTERCONNECTS
from segscale.bench.predicted_scaling import ModelInputs, prediction_rows
from segscale.bench.step_profile import Gradients
from segscale.bench.timing import Timing

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
