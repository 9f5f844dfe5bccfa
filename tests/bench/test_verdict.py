import json
from dataclasses import replace

import pytest

from segscale.bench.arrival_spread import ALTERNATIVE, GPU_SPREAD, ArrivalSpread
from segscale.bench.interconnects import find_interconnect
from segscale.bench.step_model import predict
from segscale.bench.step_profile import BatchNormSync, Collectives, Gradients, StepProfile
from segscale.bench.verdict import NVLINK, PCIE, Findings, bottleneck, findings_from, verdict
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
        "predicted": {PCIE: {2: 0.98, 4: 0.95, 8: 0.90}, NVLINK: {2: 0.99, 4: 0.98, 8: 0.97}},
        "best_option": ("trainer.precision=bf16-mixed", 1.8),
    }
    return Findings(**(values | changes))


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


@pytest.mark.parametrize("run", ["cpu-default", "cpu-512"])
def test_the_verdict_of_a_stored_run_is_made_from_its_numbers(run):
    results = json.loads((REPO / "experiments" / "scaling" / run / "bench.json").read_text())
    # Stored before strategy.sync_batchnorm became training.sync_batchnorm: the verdict
    # names the key as it was then; the numbers and every other word are the same.
    stored = results["verdict"].replace("strategy.sync_batchnorm", "training.sync_batchnorm")
    assert verdict(findings_from(results)) == stored


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
