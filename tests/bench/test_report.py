from pathlib import Path

from segscale.bench import report
from segscale.bench.predicted_scaling import prediction_rows
from segscale.bench.report import (
    DATA_BOUND,
    DATA_BOUND_NOTE,
    alternatives,
    compute_title,
    gloo_rows,
    plot_scaling,
    predicted_rows,
    run_step_text,
    storage_rows,
)
from tests.bench.test_predicted_scaling import OPTIONS, WINDOWS, gloo_link, measured


def test_the_table_shows_the_other_spread_and_sync_batchnorm_off_on_the_most_devices():
    def row(link, devices, efficiency):
        summary = {"speedup": devices * efficiency, "efficiency": efficiency, "data_bound": False}
        return {"interconnect": link, "devices": devices, **summary} | {
            "other_spread": summary | {"speedup": devices * 0.81, "efficiency": 0.81},
            "without_sync_batchnorm": summary | {"speedup": devices * 0.92, "efficiency": 0.92},
        }

    spread = {
        "used": {"name": "constant", "collective_s": 0.000214},
        "alternative": {"name": "per segment", "collective_s": 0.000015},
    }
    results = {
        "prediction": {
            "rows": [row("NVLink H100", 2, 0.8), row("NVLink H100", 8, 0.49)],
            "arrival_spread": spread,
        }
    }
    lines = alternatives(results)
    assert "on 8 devices" in lines[0] and "per segment spread (0.015 ms)" in lines[0]
    assert "sync batch norm off" in lines[0]
    assert lines[1:] == ["  NVLink H100  6.48× (81%)   7.36× (92%)"]
    assert alternatives({"prediction": {"rows": []}}) == []  # a bench.json from before


def test_the_table_sets_the_tiles_as_stored_beside_the_tiles_in_memory():
    storage = {
        "workers": 1,
        "tiles": 8,
        "stored_as": {"TIFF read by window": 8},
        "in_memory_tiles": 4,
        "decoded_mb": 268.4,
        "stored": [180.0, 170.0, 190.0],
        "in_memory": [330.0, 350.0, 340.0],
        "ratio": 180.0 / 340.0,
        "skipped": None,
    }
    assert storage_rows(storage) == [
        (
            "DataLoader, 1 workers, tiles as stored (TIFF read by window: 8)",
            "180 (rounds: 180, 170, 190)",
        ),
        ("same, decoded in memory (4 of 8 tiles, 268 MB)", "340 (rounds: 330, 350, 340)"),
        ("as stored / in memory", "0.53×"),
    ]
    skipped = storage | {"stored": [], "in_memory": [], "ratio": None, "skipped": "too big"}
    assert storage_rows(skipped)[0][1] == "not compared: too big"
    assert storage_rows(None) == []  # a bench.json from before


def scaling_results(*measured: dict) -> dict:
    """The part of bench.json that the scaling plot reads, as measured on a CPU."""
    prediction = {"rows": [], "one_device_throughput": 10.0, "this_machine_rows": []}
    return {
        "scaling": {"sync_batchnorm": True, "measured": list(measured)},
        "prediction": prediction,
    }


def run(devices: int, throughput: float | None, error: str | None = None) -> dict:
    efficiency = throughput / (10.0 * devices) if throughput else None
    return {
        "devices": devices,
        "variant": None,
        "error": error,
        "throughput": throughput,
        "efficiency": efficiency,
    }


def test_no_scaling_plot_without_a_measured_point(tmp_path: Path):
    failed = scaling_results(run(1, None, "exit 1: x"), run(2, None, "exit 1: x"))
    assert plot_scaling(failed, tmp_path / "scaling.png") is False
    assert not (tmp_path / "scaling.png").exists()
    # a point measured, one failed: the plot, with the failed run named on it
    some = scaling_results(run(1, None, "exit 1: x"), run(2, 18.0))
    some["prediction"]["this_machine_rows"] = [
        {"devices": 2, "sync_batchnorm": True, "throughput": 17.0, "efficiency": 0.85}
    ]
    assert plot_scaling(some, tmp_path / "scaling.png") is True
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_the_table_says_that_no_gpu_is_predicted_where_none_was_measured():
    assert predicted_rows([]) == [
        "Scaling, predicted on GPUs: none (bench measured no GPU; the verdict says why)"
    ]
    summary = {"speedup": 1.9, "efficiency": 0.95, "data_bound": False}
    assert predicted_rows([{"interconnect": "NVLink H100", "devices": 2, **summary}]) == [
        "Scaling, predicted: speed-up (efficiency) on 2 devices",
        "  NVLink H100  1.90× (95%)",
    ]  # no mark, no footnote


def footnoted(lines: list[str]) -> tuple[list[str], list[str]]:
    """The table's rows that carry the data-pipeline mark, and what its footnote names.

    Fails unless the footnote, where there is one, is the table's last line.
    """
    marked = [line for line in lines[1:] if f"){DATA_BOUND}" in line]
    notes = [line for line in lines if DATA_BOUND_NOTE in line]
    assert len(notes) <= 1
    if notes:
        assert lines[-1] == notes[0], lines  # the footnote follows the table
        assert notes[0].startswith(f"  {DATA_BOUND} {DATA_BOUND_NOTE}: ")
        return marked, notes[0].split(": ", 1)[1].split("; ")
    return marked, []


def test_a_data_pipeline_mark_sits_on_its_row_and_its_footnote_names_it():
    def row(link, devices, bound):
        summary = {"speedup": 0.9 * devices, "efficiency": 0.9, "data_bound": bound}
        return {"interconnect": link, "devices": devices, **summary}

    rows = [
        row("NVLink H100", 2, False),
        row("NVLink H100", 8, False),
        row("PCIe 4.0", 2, False),
        row("PCIe 4.0", 8, True),
    ]
    marked, named = footnoted(predicted_rows(rows))
    assert len(marked) == 1 and marked[0].startswith("  PCIe 4.0") and marked[0].endswith("*")
    assert named == ["PCIe 4.0 on 8 devices"]
    # no mark anywhere: no footnote
    rows[-1]["data_bound"] = False
    assert footnoted(predicted_rows(rows)) == ([], [])
    # every cell marked: each named, in the order of the table
    for r in rows:
        r["data_bound"] = True
    marked, named = footnoted(predicted_rows(rows))
    assert len(marked) == 2 and named == [
        "NVLink H100 on 2 devices",
        "NVLink H100 on 8 devices",
        "PCIe 4.0 on 2 devices",
        "PCIe 4.0 on 8 devices",
    ]


def test_the_other_tables_marks_have_their_footnotes_too():
    summary = {"speedup": 7.2, "efficiency": 0.9, "data_bound": False}
    spread = {
        "used": {"name": "constant", "collective_s": 0.0002},
        "alternative": {"name": "per segment", "collective_s": 0.00002},
    }
    row = {"interconnect": "PCIe 4.0", "devices": 8, **summary}
    row |= {"other_spread": dict(summary), "without_sync_batchnorm": dict(summary)}
    results = {"prediction": {"rows": [row], "arrival_spread": spread}}
    assert footnoted(alternatives(results)) == ([], [])
    row["without_sync_batchnorm"]["data_bound"] = True
    marked, named = footnoted(alternatives(results))
    assert len(marked) == 1 and marked[0].endswith("7.20× (90%)*")
    assert named == ["PCIe 4.0, sync batch norm off"]
    inputs = measured("Tesla V100-PCIE-16GB", 0.085)
    prediction = prediction_rows(inputs, OPTIONS, None, [1], True, WINDOWS, gloo_link())
    assert footnoted(gloo_rows(prediction)) == ([], [])  # no gloo row is data-bound here
    prediction["gloo"]["rows"][-1]["data_bound"] = True
    marked, named = footnoted(gloo_rows(prediction))
    assert len(marked) == 1 and marked[0].startswith("  8 devices")
    assert named == ["8 devices"]


def test_the_compute_title_names_the_threads_and_workers_of_a_one_device_run():
    compute = {"device": "CPU (2 cores)", "threads": 2, "loader_workers": 1}
    compute |= {"batch": 8, "precision": "32-true"}
    assert compute_title(compute) == (
        "Compute (one CPU (2 cores), 2 threads, 1 loader worker, batch 8, 32-true)"
    )
    older = compute | {"threads": None, "loader_workers": None}  # a bench.json from before
    assert compute_title(older) == "Compute (one CPU (2 cores), batch 8, 32-true)"
    # a train.py run with other threads than the step's is not compared with it
    step = {"run_step_s": 0.5, "step_vs_run": None, "threads": 2}
    text = run_step_text(step, {"threads": 1})
    assert text.startswith("500.0 ms with 1 thread (") and "(2 threads)" in text
    compared = run_step_text(step | {"step_vs_run": 0.95}, {"threads": 2})
    assert compared == "500.0 ms; bench's step / the run's: 0.950"


def test_the_table_shows_the_gloo_link_and_its_rows_under_gloo(tmp_path: Path):
    inputs = measured("Tesla V100-PCIE-16GB", 0.085)
    prediction = prediction_rows(inputs, OPTIONS, None, [1], True, WINDOWS, gloo_link())
    lines = gloo_rows(prediction)
    assert lines[0] == (
        "Scaling, predicted under gloo (Windows has no NCCL): gloo through host memory, "
        "copies 11.4 GB/s to the host and 9.6 back, host all-reduce 0.10 ms latency, "
        "0.76 GB/s bus bandwidth"
    )
    two = prediction["gloo"]["rows"][0]
    assert lines[1].startswith(
        f"  2 devices  {two['speedup']:.2f}× ({two['efficiency']:.0%}): step"
    )
    assert "gradients" in lines[1] and "synchronized batch norm" in lines[1]
    assert lines[2].startswith("  8 devices")
    assert gloo_rows(prediction | {"gloo": None}) == []
    # the scaling plot draws the gloo rows beside the NCCL ones
    results = scaling_results(run(1, 10.0), run(2, 18.0))
    results["prediction"] |= {"rows": prediction["rows"], "gloo": prediction["gloo"]}
    assert plot_scaling(results, tmp_path / "scaling.png") is True


def test_the_framework_overhead_is_shown_by_term_the_network_s_work_apart():
    terms = {
        "loader": 0.4,
        "to device": 0.001,
        "training_step": 1.0,
        "backward": 0.8,
        "non-finite check, clipping": 0.2,
        "optimizer": 0.3,
        "callback RunSummary": 0.1,
        "Lightning's loop, logging": 0.2,
    }
    rows = report.overhead_term_rows({"overhead_ms": 1.2, "terms_ms": terms})
    names = [name.strip() for name, _ in rows]
    assert names[0] == "framework overhead, by term"
    # largest first; the network's own in one row; what is too small to show counted
    assert names[1:6] == [
        "loader",
        "non-finite check, clipping",
        "Lightning's loop, logging",
        "callback RunSummary",
        "the tiny network's own",
    ]
    assert "13% of the profiled step" in rows[1][1]  # 0.4 of 3.001 ms
    assert rows[5][1].startswith("training_step 1.00 + backward 0.80 + optimizer 0.30 ms")
    assert rows[6] == ("  (below 0.005 ms)", "1 more term(s)")
    assert report.overhead_term_rows({"overhead_ms": 1.2}) == []  # a bench.json without them
