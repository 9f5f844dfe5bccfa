import json
import re
from dataclasses import replace

import pytest

from segscale.bench.predict.arrival_spread import ALTERNATIVE, GPU_SPREAD, ArrivalSpread
from segscale.bench.predict.interconnects import find_interconnect
from segscale.bench.predict.step_model import predict
from segscale.bench.predict.step_profile import BatchNormSync, Collectives, Gradients, StepProfile
from segscale.bench.predicted_scaling import prediction_rows
from segscale.bench.verdict import (
    GLOO_TERMS,
    NVLINK,
    PCIE,
    Findings,
    bottleneck,
    failed_measurements,
    findings_from,
    gpu_basis,
    verdict,
)
from tests.bench.test_predicted_scaling import OPTIONS, WINDOWS, gloo_link, measured
from tests.conftest import REPO


def numbers(**changes) -> Findings:
    values = {
        "batch": 8,
        "compute_rate": 100.0,
        "pipeline_rate": 400.0,
        "workers": 2,
        "best_workers": 4,
        "best_pipeline_rate": 700.0,
        "framework_ratio": 1.01,
        "steps_per_epoch": 500,
        "most_devices": 8,
        "predicted": {PCIE: {2: 0.98, 4: 0.95, 8: 0.90}, NVLINK: {2: 0.99, 4: 0.98, 8: 0.97}},
        "best_option": ("trainer.precision=bf16-mixed", 1.8),
        "device": "NVIDIA H100 80GB HBM3",
        "gpu_basis": GPU_BASIS,
    }
    return Findings(**(values | changes))


GPU_BASIS = {
    "device": "NVIDIA H100 80GB HBM3",
    "step_s": 0.08,
    "step": "the 1-device train.py run's",
}


def on_a_cpu(**changes) -> Findings:
    """``numbers()`` as bench measures them on a CPU: no GPU prediction, no basis for one."""
    cpu = {"predicted": {}, "gpu_basis": None, "device": "CPU (2 cores)", "flops_per_patch": 9e7}
    return numbers(**(cpu | changes))


def test_compute_bound_says_how_much_more_devices_give_and_names_the_best_option():
    text = verdict(numbers())
    assert bottleneck(numbers()) == "compute"
    assert "bottleneck is compute" in text
    assert "7.8× (97% efficiency) over NVLink H100" in text
    assert "7.2× (90%) over PCIe 5.0 x16" in text
    assert "Change first trainer.precision=bf16-mixed: measured 1.80× faster" in text


def test_compute_bound_without_a_useful_option_says_batch():
    text = verdict(numbers(best_option=("training.channels_last=true", 1.02)))
    assert "No measured option" in text and "larger per-device batch" in text


def test_data_bound_when_workers_deliver_less_than_the_device_consumes():
    data = numbers(pipeline_rate=60.0, workers=1)
    assert bottleneck(data) == "data"
    text = verdict(data)
    assert "bottleneck is the data pipeline" in text
    assert "datamodule.num_workers (measured best: 4 workers, 700.0 patches/s)." in text


def test_data_bound_even_at_the_best_worker_count_says_so():
    text = verdict(numbers(pipeline_rate=60.0, best_pipeline_rate=80.0))
    assert "still short" in text


def test_communication_bound_when_pcie_efficiency_is_low():
    slow = numbers(predicted={PCIE: {2: 0.8, 8: 0.5}, NVLINK: {2: 0.95, 8: 0.9}})
    assert bottleneck(slow) == "communication"
    text = verdict(slow)
    assert "bottleneck is communication" in text
    assert "50% (4.0×) over PCIe 5.0 x16" in text
    assert "datamodule.batch_size" in text


def test_communication_bound_by_the_gradient_all_reduce_says_batch_then_interconnect():
    terms = {
        "devices": 8,
        "sync_batchnorm_s": 0.0,
        "exposed_communication_s": 0.030,
        "collectives_s": 0.001,
        "straggler_s": 0.002,
        "overhead_s": 0.001,
        "step_s": 0.080,
    }
    slow = numbers(predicted={PCIE: {8: 0.5}, NVLINK: {8: 0.9}}, pcie_terms=terms, gpu_terms=terms)
    text = verdict(slow)
    assert "on 8 devices the gradient all-reduce past the backward pass takes 30.0 ms" in text
    assert "Change first a larger per-device batch (datamodule.batch_size" in text
    assert "then the interconnect" in text and "sync_batchnorm" not in text


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"steps_per_epoch": 40}, "An epoch is 40 steps on one device, 5.0 on each of 8"),
        ({"framework_ratio": 1.10}, "Lightning's step takes 1.10× the bare PyTorch loop's"),
        ({"measured": {2: 0.5}, "predicted_here": {2: 0.95}}, "below the predicted 95%"),
        ({"measured": {2: 0.9}, "predicted_here": {2: 0.95}}, "90% efficiency (predicted 95%)"),
        ({"sync_batchnorm_gain": (2, 1.6)}, "training.sync_batchnorm=false measured 1.60×"),
    ],
)
def test_warnings(change, expected):
    assert expected in verdict(numbers(**change))
    assert expected not in verdict(numbers())


def test_a_small_sync_batchnorm_cost_is_not_mentioned():
    assert "sync_batchnorm" not in verdict(numbers(sync_batchnorm_gain=(2, 1.05)))


def test_compute_bound_without_measured_options_says_so():
    assert "no speed option was measured" in verdict(numbers(best_option=None))


def sentences(text: str) -> list[str]:
    """A verdict's sentences (each ends with a full stop and the next starts a capital)."""
    return re.split(r"(?<=\.) (?=[A-Z])", text)


@pytest.mark.parametrize("run", ["cpu-default", "cpu-512"])
def test_a_stored_cpu_run_no_longer_predicts_gpus_from_its_cpu_step(run):
    results = json.loads((REPO / "experiments" / "scaling" / run / "bench.json").read_text())
    # Stored before strategy.sync_batchnorm became training.sync_batchnorm, and before
    # bench stopped scaling a CPU's step into GPU predictions (issue 46): every sentence
    # of today's verdict but the two that replace the GPU ones is the stored verdict's.
    stored = results["verdict"].replace("strategy.sync_batchnorm", "training.sync_batchnorm")
    text = verdict(findings_from(results))
    new = [s for s in sentences(text) if s not in sentences(stored)]
    assert new == [
        "The data pipeline keeps up with this machine's CPU (2 cores).",
        *sentences(gpu_basis(findings_from(results))[0]),
    ]
    assert new[1].startswith("GPUs are not predicted: bench measured CPU (2 cores), not a GPU")
    gone = [s for s in sentences(stored) if s not in sentences(text)]
    assert len(gone) == 3 and all("GPU" in s or "NVLink" in s for s in gone), gone
    assert "NVLink" not in text and "PCIe" not in text


def test_a_cpu_verdict_says_bench_has_no_basis_for_gpus_and_predicts_none():
    cpu = on_a_cpu()
    assert bottleneck(cpu) is None  # the pipeline keeps up; GPUs are not predicted
    text = verdict(cpu)
    assert (
        "GPUs are not predicted: bench measured CPU (2 cores), not a GPU, and has no basis "
        "for this config's step on one (it holds no published step time of this config, its "
        "0.09 GFLOP per patch give a GPU's step only at a share of that GPU's peak that "
        "bench has not measured, and a CPU's step is not a GPU's)."
    ) in text
    assert "run bench.py on a machine with one GPU" in text
    assert "×" not in text.replace("1.80× faster per step", "")  # no GPU speed-up
    assert "Change first trainer.precision=bf16-mixed: measured 1.80× faster per step" in text
    assert "bottleneck is compute" not in text and "more devices help" not in text
    assert "An epoch is 40 steps on one device, 5.0 on each of 8" in verdict(
        on_a_cpu(steps_per_epoch=40)
    )


def test_a_data_bound_cpu_verdict_says_so_and_predicts_no_gpus():
    text = verdict(on_a_cpu(pipeline_rate=60.0))
    assert "bottleneck is the data pipeline" in text and "GPUs are not predicted" in text


def test_a_gpu_verdict_says_its_predictions_are_built_from_the_step_measured_on_that_gpu():
    text = verdict(numbers())
    assert (
        "The GPU predictions are built from the step measured here on one NVIDIA H100 80GB "
        "HBM3 (80.0 ms for 8 patches, the 1-device train.py run's): each row is N of these "
        "GPUs over its interconnect"
    ) in text
    assert "GPUs are not predicted" not in text


FAILED = ("ddp on 2 devices", "exit 1: In 'datamodule/synthetic': Could not find 'x'", "s/c.log")


def test_a_failed_measurement_opens_the_verdict_with_its_error():
    text = verdict(on_a_cpu(failed=(FAILED,)))
    assert text.startswith(
        "1 of bench's measurements failed, and what follows is made without it: ddp on 2 "
        "devices (exit 1: In 'datamodule/synthetic': Could not find 'x'; its output: s/c.log)."
    )
    assert "Without the 1-device train.py run" not in text
    one = ("ddp on 1 device", "exit 2: bad", "scaling/devices_1/console.log")
    option = ("the bare step, training.compile=true", "RuntimeError: no compiler", None)
    text = verdict(numbers(failed=(one, option)))
    assert text.startswith(
        "2 of bench's measurements failed, and what follows is made without them: ddp on 1 "
        "device (exit 2: bad; its output: scaling/devices_1/console.log); the bare step, "
        "training.compile=true (RuntimeError: no compiler)."
    )
    assert "Without the 1-device train.py run the prediction starts from bench's own step" in text
    assert "failed" not in verdict(numbers())


def test_failed_measurements_are_read_from_bench_json():
    def run(devices, variant=None, error=None):
        return {"devices": devices, "variant": variant, "error": error, "console": "c.log"}

    results = {
        "scaling": {
            "measured": [run(1), run(2, error="exit 1: x"), run(2, "b=false", error="exit 1: y")]
        },
        "options": [
            {"option": "as configured", "error": None},
            {"option": "training.compile=true", "error": "RuntimeError: z"},
        ],
    }
    assert failed_measurements(results) == [
        {"measurement": "ddp on 2 devices", "error": "exit 1: x", "output": "c.log"},
        {"measurement": "ddp on 2 devices, b=false", "error": "exit 1: y", "output": "c.log"},
        {
            "measurement": "the bare step, training.compile=true",
            "error": "RuntimeError: z",
            "output": None,
        },
    ]
    results["scaling"]["measured"][0]["error"] = "exit 1: w"
    assert failed_measurements(results)[0]["measurement"] == "ddp on 1 device"


def test_the_verdict_names_what_limits_this_machine_with_its_numbers():
    here = {
        "devices": 2,
        "slowdown": 1.28,
        "sync_batchnorm_s": 0.120,
        "exposed_communication_s": 0.040,
        "straggler_s": 0.030,
        "step_s": 0.750,
    }
    text = verdict(numbers(here_terms=here))
    assert "independent loops alone run 1.28× slower side by side" in text
    assert "2 processes reach at most 1.56×" in text
    assert "synchronized batch norm costs a further 120 ms per step" in text
    assert "the gradient all-reduce 40 ms" in text and "predicted 750 ms step" in text


def test_the_verdict_names_the_largest_gpu_cost_and_the_share_of_peak():
    gpu = {
        "devices": 8,
        "sync_batchnorm_s": 0.004,
        "exposed_communication_s": 0.001,
        "collectives_s": 0.0002,
        "straggler_s": 0.002,
        "overhead_s": 0.001,
        "step_s": 0.050,
    }
    text = verdict(numbers(gpu_terms=gpu, flops_per_s=4e14, peak_fraction=0.41, device="H100"))
    assert "largest cost beyond compute would be synchronized batch norm: 4.0 ms" in text
    assert "400000.0 GFLOP/s: compute-bound at 41% of the H100's peak" in text


def h100_example() -> Findings:
    """Issue 26's run: DeepLabV3+ R50, batch 16, a 44 ms step, synchronized batch norm.

    Its rows are built as bench.json's are (``forecast.prediction_rows``): each with the
    prediction under the other spread model and without synchronized batch norm.
    """
    step, overhead, batch = 0.044, 0.00188, 16
    compute = step - overhead
    profile = StepProfile(
        compute * 0.97 / 3, compute * 0.97 * 2 / 3, compute * 0.03, batch, 0.05, overhead
    )
    gradients = Gradients.uniform([26.7e6 * 4 / 100] * 100)  # 26.7 M float32 gradients
    synced = BatchNormSync(62, (2 * 400 + 1) * 8, 1, 1, 0)  # smp's 62 batch-norm layers
    collectives = Collectives.ddp(200e3)

    def row(link: str, n: int, bn: BatchNormSync | None, spread: ArrivalSpread) -> dict:
        host = spread.host(profile, bn, collectives)
        curve = find_interconnect(link)
        return predict(profile, gradients, n, curve, host, bn, collectives).as_dict()

    predicted, rows = {}, {}
    for link in (PCIE, NVLINK):
        for n in (2, 4, 8):
            rows[link, n] = row(link, n, synced, GPU_SPREAD)
            rows[link, n]["other_spread"] = row(link, n, synced, ALTERNATIVE)
            rows[link, n]["without_sync_batchnorm"] = row(link, n, None, GPU_SPREAD)
            predicted.setdefault(link, {})[n] = rows[link, n]["efficiency"]
    spread = {
        name: model.as_dict() | {"collective_s": model.host(profile, synced).skew_s}
        for name, model in (("used", GPU_SPREAD), ("alternative", ALTERNATIVE))
    }
    return numbers(
        batch=batch,
        compute_rate=batch / step,
        pipeline_rate=600.0,
        predicted=predicted,
        gpu_terms=rows[NVLINK, 8],
        pcie_terms=rows[PCIE, 8],
        spread=spread,
    )


def test_the_verdict_names_sync_batchnorm_and_gives_the_prediction_without_it():
    example = h100_example()
    assert example.gpu_terms["sync_batchnorm_s"] == pytest.approx(0.0423, abs=5e-4)
    assert example.gpu_terms["exposed_communication_s"] < 0.001
    assert example.predicted[NVLINK][8] == pytest.approx(0.49, abs=0.01)
    text = verdict(example)
    assert bottleneck(example) == "communication"
    assert "gradient all-reduce that the backward pass cannot hide" not in text
    assert "The bottleneck is communication: on 8 devices synchronized batch norm takes" in text
    assert "42.3 ms of 90 over NVLink H100" in text
    off = example.gpu_terms["without_sync_batchnorm"]["efficiency"]
    assert off > 0.9
    assert "Change first training.sync_batchnorm=false: predicted " in text
    assert f"{off:.0%} ({8 * off:.1f}×) over NVLink H100" in text
    assert "its own 16 patches instead of 16 × 8 = 128" in text


def test_the_verdict_states_the_spread_assumption_its_source_and_the_other_model():
    example = h100_example()
    text = verdict(example)
    assert "assumed to arrive 0.214 ms apart (std, the constant spread model" in text
    assert "PaddlePaddle's DeepLabV3+ with synchronized batch norm on 8 V100s in fp32" in text
    other = example.gpu_terms["other_spread"]
    assert other["efficiency"] > example.predicted[NVLINK][8] + 0.2
    assert f"would reach {other['efficiency']:.0%}" in text
    assert "fits the published rows worse" in text


def test_a_compute_bound_verdict_gives_the_sync_batchnorm_lever_when_it_is_the_largest_cost():
    example = h100_example()
    compute_bound = replace(example, predicted={PCIE: {8: 0.8}, NVLINK: {8: 0.8}}, pcie_terms=None)
    text = verdict(compute_bound)
    assert "largest cost beyond compute would be synchronized batch norm: 42.3 ms" in text
    assert "Without it, training.sync_batchnorm=false: predicted" in text


def on_windows(**changes) -> Findings:
    """Two V100s under gloo: the seed's question, with a gloo row on 2 GPUs (hand numbers)."""
    gloo = {
        "devices": 2,
        "sync_batchnorm_s": 0.218,
        "exposed_communication_s": 0.025,
        "collectives_s": 0.001,
        "straggler_s": 0.005,
        "overhead_s": 0.0,
        "step_s": 0.651,
        "speedup": 1.24,
        "efficiency": 0.62,
        "gloo_parts": {
            "device_to_host_s": 0.010,
            "host_allreduce_s": 0.154,
            "host_to_device_s": 0.012,
        },
        "without_sync_batchnorm": {"efficiency": 0.93, "speedup": 1.86},
    }
    predicted = {
        "PCIe 3.0 x16": {2: 0.84, 8: 0.6},
        PCIE: {2: 0.95, 8: 0.8},
        NVLINK: {2: 0.98, 8: 0.9},
    }
    values = {
        "batch": 10,
        "device": "Tesla V100-PCIE-16GB",
        "predicted": predicted,
        "gloo_reason": "Windows has no NCCL",
        "gloo_terms": gloo,
    }
    return numbers(**(values | changes))


def test_under_gloo_the_verdict_names_synchronized_batch_norm_through_host_memory():
    example = on_windows()
    assert bottleneck(example) == "communication"  # 62 % under gloo, whatever NCCL gives
    text = verdict(example)
    assert (
        "The bottleneck is communication through host memory: these GPUs' ranks would use "
        "gloo (Windows has no NCCL), which copies every all-reduce to host memory"
    ) in text
    assert (
        "on 2 GPUs synchronized batch norm through host memory takes 218.0 ms of a 651 ms "
        "step (two collectives per batch-norm layer, each a host sync under gloo), which "
        "leaves 62% (1.2×)."
    ) in text
    assert (
        "With NCCL (on Linux, or in WSL2 on this machine) the same config on 2 GPUs would "
        "reach 84% (1.7×) over PCIe 3.0 x16, 95% (1.9×) over PCIe 5.0 x16 and 98% (2.0×) "
        "over NVLink H100."
    ) in text
    assert "Change first training.sync_batchnorm=false: predicted 93% (1.9×) under gloo" in text
    assert "slower than one GPU" not in text


def test_under_gloo_the_verdict_names_the_gradient_all_reduce_and_its_parts_when_largest():
    terms = on_windows().gloo_terms | {
        "sync_batchnorm_s": 0.0,
        "exposed_communication_s": 0.450,
        "step_s": 0.860,
        "speedup": 0.94,
        "efficiency": 0.47,
    }
    text = verdict(on_windows(gloo_terms=terms))
    assert (
        "on 2 GPUs the gradient all-reduce through host memory past the backward pass takes "
        "450.0 ms of a 860 ms step (the step's gradients spend 10.0 ms copied to the host, "
        "154.0 ms in gloo's host all-reduce and 12.0 ms copied back; what runs beside the "
        "backward pass is hidden), which leaves 47% (0.9×), slower than one GPU."
    ) in text
    assert "Change first the backend: train with NCCL (WSL2 or Linux)." in text
    assert "84% (1.7×) over PCIe 3.0 x16" in text


def test_under_gloo_a_compute_bound_verdict_still_sets_nccl_beside_it():
    terms = on_windows().gloo_terms | {"sync_batchnorm_s": 0.0, "step_s": 0.43, "efficiency": 0.93}
    example = on_windows(gloo_terms=terms)
    assert bottleneck(example) == "compute"
    text = verdict(example)
    assert (
        "The bottleneck is compute, so more devices help even though these GPUs' ranks would "
        "use gloo (Windows has no NCCL)"
    ) in text
    assert "largest cost beyond compute being the gradient all-reduce through host memory" in text
    assert "With NCCL (on Linux, or in WSL2 on this machine)" in text
    assert "Change first trainer.precision=bf16-mixed" in text  # the options advice follows


def test_without_gloo_the_verdict_says_nothing_of_host_memory():
    for example in (numbers(), h100_example()):
        assert "host memory" not in verdict(example) and "gloo" not in verdict(example)


def test_a_gpu_bench_json_under_gloo_gives_the_gloo_verdict_on_this_machine_s_gpus():
    # A stored bench.json (2 processes measured) as a GPU machine's under gloo would hold
    # it: its prediction built by prediction_rows from a V100's step over gloo's link.
    results = json.loads(
        (REPO / "experiments" / "scaling" / "cpu-default" / "bench.json").read_text()
    )
    results["config"]["accelerator"] = "cuda"
    inputs = measured("Tesla V100-PCIE-16GB", 0.085)
    results["prediction"] = prediction_rows(
        inputs, OPTIONS, None, [1, 2], True, WINDOWS, gloo_link(0.3e9)
    )
    findings = findings_from(results)
    assert findings.gloo_reason == "Windows has no NCCL"
    assert findings.gloo_terms["devices"] == 2  # this machine's (at least 2)
    text = verdict(findings)
    key = max(GLOO_TERMS, key=lambda name: findings.gloo_terms[name])
    assert f"on 2 GPUs {GLOO_TERMS[key]} takes" in text
    assert "With NCCL (on Linux, or in WSL2 on this machine) the same config on 2 GPUs" in text
    del results["prediction"]["gloo"]  # a bench.json from before: no gloo rows
    assert findings_from(results).gloo_terms is None
