from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from segscale.configs import CONFIG_DIR, compose_config


def test_the_config_tree_is_found_inside_the_package():
    cfg = compose_config("train", ["optimizer.lr=0.05"])
    assert cfg.optimizer.lr == 0.05 and "datamodule" in cfg


def test_composing_inside_a_running_hydra_leaves_it_as_it_was(tmp_path):
    (tmp_path / "app.yaml").write_text("answer: 42\n")
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        caller = GlobalHydra.instance().hydra
        cfg = compose_config("predict", ["accelerator=cpu"])
        assert cfg.accelerator == "cpu"
        assert GlobalHydra.instance().hydra is caller
        assert compose("app").answer == 42  # the caller's own config, still composable
    assert not GlobalHydra.instance().is_initialized()


def test_a_bad_override_is_hydras_error_and_leaves_no_hydra_behind():
    with pytest.raises(Exception, match="no_such_group"):
        compose_config("train", ["no_such_group=x"])
    assert not GlobalHydra.instance().is_initialized()
    assert CONFIG_DIR.endswith("conf")


def test_speed_max_sets_the_fast_path():
    cfg = compose_config("train", ["speed=max"])
    assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.benchmark is True
    assert cfg.training.channels_last is True and cfg.optimizer.fused is True
    assert cfg.training.compile is False  # not until its GPU test passes
    default = compose_config("train", [])
    assert default.optimizer.fused is None and default.trainer.precision == "32-true"


PRESET = "deeplabv3plus_inceptionresnetv2-d16_b20-10e_512x512"


def test_the_preset_is_named_for_what_it_trains_and_its_old_name_still_works():
    named = compose_config("train", [f"experiment={PRESET}"])
    old = compose_config("train", ["experiment=matlab_deeplabv3plus"])
    assert named.model.encoder == "inceptionresnetv2" and named.model.output_stride == 16
    assert named.datamodule.batch_size == 20 and named.trainer.max_epochs == 10
    assert named.datamodule.patch_size == 512
    assert named.task_name == PRESET
    # The old name is the same preset; its runs keep their folder (task_name), so a run
    # started under it resumes with experiment=matlab_deeplabv3plus ckpt_path=last.
    assert old.task_name == "matlab_deeplabv3plus"
    old.task_name = PRESET
    assert old == named


def test_no_config_names_an_entry_point_module():
    """A ``_target_`` in conf/ names library code: the import contract cannot see a config."""
    import re
    from pathlib import Path

    targets = {
        (path.relative_to(CONFIG_DIR).as_posix(), match)
        for path in Path(CONFIG_DIR).rglob("*.yaml")
        for match in re.findall(r"_target_:\s*(\S+)", path.read_text())
    }
    assert targets, "no _target_ found: the scan reads nothing"
    assert not [t for t in targets if t[1].startswith("segscale.cli.")]


def test_the_aerial_preset_sets_mmsegs_recipe_and_keeps_the_matlab_pose(tiny_data_root):
    import albumentations as A

    from segscale.runs.builders import build
    from tests.conftest import tiny_overrides

    for datamodule in ("synthetic", "folder"):
        cfg = compose_config("train", [f"datamodule={datamodule}", "experiment=aerial"])
        assert cfg.datamodule.sampling.max_class_ratio == 0.75
        assert list(cfg.datamodule.augmentation.rotation) == [-20, 20]
        assert cfg.loss.ohem_thresh == 0.7 and cfg.loss.cross_entropy == 1.0
    # Its own run folder, and the docs' section on it says which.
    assert cfg.task_name == "aerial"
    page = (Path(__file__).resolve().parents[1] / "docs/own-data.md").read_text()
    section = page[page.index("## Aerial imagery") :].split("\n## ", 1)[0]
    assert f"outputs/{cfg.task_name}/<date>_<time>/" in section
    tiny = [o for o in tiny_overrides(tiny_data_root, None) if o.startswith("datamodule.")]
    datamodule = build(compose_config("train", [*tiny, "experiment=aerial"]).datamodule)
    augmentation = datamodule.augmentation
    kinds = [type(t) for t in augmentation.pipeline.transforms]
    assert kinds == [
        A.HorizontalFlip,
        A.VerticalFlip,
        A.RandomRotate90,
        A.RandomBrightnessContrast,
        A.ColorJitter,
    ]
    assert augmentation.scale == (0.5, 2.0) and augmentation.translate_x == (-10.0, 10.0)
    datamodule.setup("fit")
    assert datamodule.train_set.max_class_ratio == 0.75
    assert datamodule.train_set[(0, 1)]["image"].shape == (3, 64, 64)
