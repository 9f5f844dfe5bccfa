from segscale.bench.report import alternatives


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
