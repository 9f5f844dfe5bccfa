import pytest

from segscale.data.datamodule import MAX_AUTO_WORKERS, auto_num_workers


@pytest.mark.parametrize(
    ("cpus", "ranks", "workers"),
    [
        (2, 1, 1),
        (2, 2, 1),
        (16, 1, MAX_AUTO_WORKERS),
        (16, 2, 7),
        (16, 8, 1),
        (64, 8, 7),
        (1, 1, 1),
    ],
)
def test_auto_num_workers_is_the_ranks_share_of_the_cores_minus_one(cpus, ranks, workers):
    assert auto_num_workers(ranks, cpus=cpus) == workers


def test_loader_options_reach_the_dataloader(make_config, tmp_path):
    from segscale.training.builders import build_datamodule
    from segscale.training.scaling import ScalingRules

    cfg = make_config(
        "datamodule.num_workers=auto",
        "datamodule.prefetch_factor=3",
        "datamodule.persistent_workers=false",
    )
    effective = ScalingRules().resolve(cfg.datamodule.batch_size, 0.01, 1)
    datamodule = build_datamodule(cfg, effective)
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    assert loader.num_workers == auto_num_workers(1)
    assert loader.prefetch_factor == 3
    assert not loader.persistent_workers
    assert not loader.pin_memory  # no GPU: page-locked memory would only cost
    assert datamodule.train_dataloader(num_workers=0).prefetch_factor is None
