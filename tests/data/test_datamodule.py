import numpy as np
import pytest

from segscale.data.sampling.loaders import MAX_AUTO_WORKERS, EpochShardSampler, auto_num_workers
from tests.helpers.fake_cpus import fake_cgroups, fake_mask, no_launcher, slurm_task


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


def test_auto_num_workers_keep_within_the_cpu_quota(monkeypatch, tmp_path):
    # A 2-CPU container on a 16-core host: one worker beside the main process, not 8.
    fake_mask(monkeypatch, 16)
    no_launcher(monkeypatch)
    fake_cgroups(monkeypatch, tmp_path, "0::/\n", {"cpu.max": "200000 100000"})
    assert auto_num_workers(1) == 1


def test_a_slurm_ranks_workers_share_only_its_own_cores(monkeypatch):
    # srun --ntasks-per-node=4 --cpus-per-task=8: 7 workers beside the main process, not 1.
    slurm_task(monkeypatch, 3, tasks=4, cpus="8")
    assert auto_num_workers(4, cpus=8) == 7


def test_loader_options_reach_the_dataloader(make_config, tmp_path):
    from segscale.runs.builders import build_datamodule
    from segscale.runs.scaling.rules import ScalingRules

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


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver", "auto"])
def test_the_start_method_reaches_the_dataloaders_with_workers(make_config, method):
    from segscale.platforms.parallel import default_start_method
    from segscale.runs.builders import build_datamodule
    from segscale.runs.scaling.rules import ScalingRules

    cfg = make_config("datamodule.num_workers=1", f"datamodule.worker_start_method={method}")
    datamodule = build_datamodule(cfg, ScalingRules().resolve(cfg.datamodule.batch_size, 0.01, 1))
    datamodule.setup("fit")
    expected = default_start_method() if method == "auto" else method
    for loader in (datamodule.train_dataloader(), datamodule.val_dataloader()):
        assert loader.multiprocessing_context.get_start_method() == expected
    assert datamodule.train_dataloader(num_workers=0).multiprocessing_context is None


def epoch_keys(datamodule, epoch: int) -> list[tuple[int, int]]:
    """The patch keys ``(epoch, index)`` the training loader gives in ``epoch``, in order."""
    loader = datamodule.train_dataloader()
    loader.batch_sampler.set_epoch(epoch)
    return [tuple(key.tolist()) for batch in loader for key in batch["key"]]


@pytest.mark.parametrize("shuffle", ["every-epoch", "once", "never"])
def test_the_shuffle_key_reaches_the_training_loader(make_config, shuffle):
    from segscale.runs.builders import build_datamodule
    from segscale.runs.scaling.rules import ScalingRules

    cfg = make_config(f"datamodule.shuffle={shuffle}")
    datamodule = build_datamodule(cfg, ScalingRules().resolve(4, 0.01, 1))
    datamodule.setup("fit")
    first, second = epoch_keys(datamodule, 0), epoch_keys(datamodule, 1)
    in_order = [(0, i) for i in range(16)]  # 2 tiles × 8 patches, 4 batches of 4
    if shuffle == "every-epoch":  # each epoch its own patches, in its own order
        assert {e for e, _ in second} == {1} and sorted(first) == in_order
        assert [i for _, i in first] != [i for _, i in second]
    elif shuffle == "once":  # epoch 0's patches, in the one order drawn
        assert second == first != in_order and sorted(first) == in_order
    else:  # epoch 0's patches, in index order
        assert second == first == in_order


BALANCED = (
    "datamodule.sampling.mode=class_balanced",
    "datamodule.sampling.p=0.6",
    "datamodule.sampling.class_weights=inverse_frequency",
    "datamodule.sampling.locations_per_class=32",
)


def rank_steps(
    make_config, monkeypatch, world: int, rank: int, *overrides: str
) -> list[list[tuple]]:
    """Keys and image bytes of each step that ``rank`` of ``world`` trains on, epoch 1."""
    from segscale.runs.builders import build_datamodule
    from segscale.runs.scaling.rules import ScalingRules

    cfg = make_config(*BALANCED, "datamodule.batch_size=8", "scaling.batch=global", *overrides)
    effective = ScalingRules(batch="global").resolve(8, 0.01, world)
    datamodule = build_datamodule(cfg, effective)
    # As under a trainer of `world` ranks.
    monkeypatch.setattr(datamodule, "_rank_and_world", lambda: (rank, world))
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    assert isinstance(loader.batch_sampler, EpochShardSampler)
    loader.batch_sampler.set_epoch(1)
    return [
        [
            (tuple(k.tolist()), i.numpy().tobytes())
            for k, i in zip(b["key"], b["image"], strict=True)
        ]
        for b in loader
    ]


def test_one_and_two_ranks_train_on_the_same_class_balanced_patches(make_config, monkeypatch):
    one = rank_steps(make_config, monkeypatch, 1, 0)
    ranks = [
        rank_steps(make_config, monkeypatch, 2, r, "datamodule.num_workers=1") for r in range(2)
    ]
    assert [len(r) for r in ranks[0]] == [4, 4]  # 16 patches: 2 steps, 4 on each rank
    assert [a + b for a, b in zip(*ranks, strict=True)] == one


def test_class_balanced_sampling_reaches_the_training_set(make_config):
    from segscale.runs.builders import build

    datamodule = build(make_config(*BALANCED).datamodule, _convert_="all")
    datamodule.setup("fit")
    data = datamodule.train_set
    assert data.centres is not None and data.centres.p == 0.6
    report = datamodule.check()
    assert [len(t.points[0]) for t in report.class_locations["train"]] == [32, 32]
    centred = [data.draw(0, i).centre_class for i in range(400)]
    assert 0.5 < np.mean([c is not None for c in centred]) < 0.7
    uniform = build(make_config().datamodule, _convert_="all")
    uniform.setup("fit")
    assert uniform.train_set.centres is None and uniform.check().class_locations == {}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("datamodule.sampling.mode=rare", r"datamodule.sampling.mode='rare' is not allowed"),
        ("datamodule.sampling.p=1.5", r"datamodule.sampling.p=1.5 is not allowed"),
        ("datamodule.sampling.p=often", r"datamodule.sampling.p='often' is not allowed"),
        ("datamodule.sampling.class_weights=[1,2]", r"class_weights=\[1.0, 2.0\] has 2 entries"),
        ("datamodule.sampling.class_weights=[0,0,0,0,0,0]", r"sampling.class_weights=\[0, 0"),
        ("datamodule.sampling.class_weights=rarest", r"class_weights='rarest' is not allowed"),
        ("datamodule.sampling.locations_per_class=0", r"locations_per_class=0 is not allowed"),
        ("+datamodule.sampling.probability=1", r"datamodule.sampling.probability is not a"),
    ],
)
def test_a_bad_sampling_config_names_its_key(make_config, override, message):
    from segscale.errors import ConfigError
    from segscale.training.run.training_run import train

    with pytest.raises(ConfigError, match=message):
        train(make_config(*BALANCED, override))


def test_the_config_keys_reach_the_datamodule_as_its_grouped_settings(tmp_path):
    from segscale.data.datamodule import (
        ClassSettings,
        LoaderSettings,
        Normalization,
        PatchSettings,
        SegmentationDataModule,
        segmentation_datamodule,
    )
    from segscale.data.datasets.synthetic import SyntheticTiles

    source = SyntheticTiles(root=str(tmp_path), num_train=2, num_val=1, image_size=96)
    flat = segmentation_datamodule(
        source, 3, ["a", "b", "c"], patch_size=32, batch_size=4, seed=7, mean=None, ignore_ids=[9]
    )
    grouped = SegmentationDataModule(
        source,
        ClassSettings(3, ["a", "b", "c"], ignore_ids=[9]),
        PatchSettings(patch_size=32, seed=7),
        LoaderSettings(batch_size=4),
        Normalization(mean=None),
    )
    for dm in (flat, grouped):
        assert (dm.num_classes, dm.class_names, dm.patch_size, dm.seed) == (
            3,
            ("a", "b", "c"),
            32,
            7,
        )
        assert (dm.batch_size, dm.val_batch_size, dm.num_workers) == (4, 4, "auto")
        assert dm.labels.ignore_ids == (9,) and dm._mean is None and dm._in_channels == 3


# 2 tiles × 5 patches in batches of 2: 5 batches in windows of 2; validated after batch 3,
# inside the second window (val_check_interval is not a multiple of the window).
MID_WINDOW = (
    "datamodule.patches_per_image=5",
    "datamodule.batch_size=2",
    "datamodule.patch_size=32",
    "trainer.accumulate_grad_batches=2",
    "trainer.val_check_interval=3",
    "trainer.max_epochs=1",
    "callbacks.validation_report=null",
    "callbacks.training_progress=null",
    "callbacks.model_checkpoint.save_top_k=-1",  # every validation's checkpoint kept
    "callbacks.model_checkpoint.filename='step{step}'",
    "+callbacks.record._target_=tests.helpers.record_batches.RecordBatches",
)


@pytest.mark.slow
def test_a_run_resumed_inside_a_window_trains_the_batches_lightning_counts(make_config, tmp_path):
    from segscale.training.run.training_run import train
    from tests.helpers.record_batches import recorded

    run = tmp_path / "run"
    train(make_config(*MID_WINDOW, f"+callbacks.record.folder={tmp_path}/whole"))
    whole, validations = recorded(tmp_path / "whole")
    assert [(v["step"], v["validated"]) for v in validations] == [(1, 0)]
    # The checkpoint of the validation after batch 2 (0-based): 3 batches done, 1 step.
    train(
        make_config(
            *MID_WINDOW,
            f"+callbacks.record.folder={tmp_path}/resumed",
            f"ckpt_path={run}/checkpoints/step1.ckpt",
        )
    )
    resumed, _ = recorded(tmp_path / "resumed")
    # Lightning counts 3 batches done and steps after its 4th and 5th: the sampler hands
    # it batches 3 and 4, not 2 and 3 (batch 4 was never trained).
    assert [b["batch"] for b in resumed] == [3, 4]
    assert [b["keys"] for b in resumed] == [b["keys"] for b in whole[3:]]
    assert [b["step"] for b in resumed] == [b["step"] for b in whole[3:]] == [2, 3]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("datamodule.sampling.min_valid=1.5", r"datamodule.sampling.min_valid=1.5 is not allowed"),
        ("datamodule.sampling.min_valid=-0.1", r"sampling.min_valid=-0.1 is not allowed"),
        ("datamodule.sampling.min_valid=true", r"sampling.min_valid=True is not allowed"),
        ("datamodule.sampling.nodata=none", r"datamodule.sampling.nodata='none' is not allowed"),
        ("datamodule.sampling.nodata=nan", r"datamodule.sampling.nodata=nan is not allowed"),
    ],
)
def test_a_bad_valid_share_or_nodata_names_its_key(make_config, override, message):
    from segscale.errors import ConfigError
    from segscale.training.run.training_run import train

    with pytest.raises(ConfigError, match=message):
        train(make_config(override))


def test_min_valid_reaches_the_training_set_and_zero_changes_nothing(tmp_path):
    from segscale.runs.builders import build
    from tests.conftest import compose_config
    from tests.helpers.valid_maps import (
        geotiff_dataset,
        patch_share,
        rotation_reach,
        valid_pixels_of,
    )

    root = geotiff_dataset(tmp_path / "geo")
    folder = ("datamodule=folder", f"datamodule.source.root={root}", "datamodule.patch_size=32")
    folder += ("datamodule.num_workers=0",)
    cfg = compose_config("train", *folder, "datamodule.sampling.min_valid=0.8", BALANCED[0])
    datamodule = build(cfg.datamodule, _convert_="all")
    datamodule.setup("fit")
    data = datamodule.train_set
    assert len(data.tiles) == len(data.windows) == len(data.centres.locations) == 1  # t2 out
    assert data.windows[0].min_valid == 0.8 and data.windows[0].size == 32
    pair = datamodule.check().pairs["train"][0]
    valid = valid_pixels_of(pair.image, pair.mask, 0)  # the GeoTIFF's tag: 0
    for index in range(40):  # cut from the GeoTIFF read by window
        draw = data.draw(0, index)
        assert data[(0, index)]["mask"].shape == (32, 32)
        assert patch_share(valid, draw.pose, 32) >= 0.8 - 1 / 32 - rotation_reach(20)
    off = build(compose_config("train", *folder).datamodule, _convert_="all")
    off.setup("fit")
    assert off.sampling.min_valid == 0.0 and off.sampling.nodata is None
    assert off.train_set.windows is None and off.check().valid_windows == {}
    assert len(off.train_set.tiles) == 2


def test_max_class_ratio_reaches_the_training_set_and_a_bad_one_names_its_key(make_config):
    from segscale.errors import ConfigError
    from segscale.runs.builders import build

    datamodule = build(
        make_config("datamodule.sampling.max_class_ratio=0.75").datamodule, _convert_="all"
    )
    datamodule.setup("fit")
    assert datamodule.sampling.max_class_ratio == datamodule.train_set.max_class_ratio == 0.75
    with pytest.raises(ConfigError, match=r"sampling\.max_class_ratio=1.5 is not allowed"):
        build(make_config("datamodule.sampling.max_class_ratio=1.5").datamodule, _convert_="all")
