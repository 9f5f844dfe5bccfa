import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from segscale.configs import CONFIG_DIR, compose_config
from tests.conftest import REPO

PRIMARY = ("train", "bench", "predict", "evaluate", "export", "data")
"""The config of each command (train.py, bench.py, ...): conf/<name>.yaml."""

PRESET = "deeplabv3plus_inceptionresnetv2-d16_b20-10e_512x512"
"""The MATLAB script's preset (conf/experiment/): 10 epochs, batches of 20."""


def test_a_checkout_runs_on_its_own_top_level_config_tree():
    # segscale imported from <checkout>/src: the conf/ beside it, not another install's.
    assert Path(CONFIG_DIR) == REPO / "conf"
    cfg = compose_config("train", ["optimizer.lr=0.05"])
    assert cfg.optimizer.lr == 0.05 and "datamodule" in cfg


@pytest.mark.parametrize("name", PRIMARY)
def test_every_command_takes_the_shared_hydra_settings(name):
    hydra = compose_config(name, return_hydra_config=True).hydra
    assert hydra.runtime.choices["hydra"] == "default"
    assert hydra.runtime.choices["hydra/job_logging"] == "utf8"
    assert hydra.job.chdir is False
    assert hydra.callbacks.output_folder._target_ == (
        "segscale.output_folder_check.OutputFolderCheck"
    )
    # train.py and predict.py write their own record; bench.py does not train through train().
    subdir = None if name in ("train", "predict") else ".hydra"
    assert hydra.output_subdir == subdir
    run_dir = hydra.run._get_node("dir")._value()
    if name in ("train", "bench"):  # a resumed run goes back to its own folder
        assert run_dir.startswith("${segscale.run_dir:${ckpt_path},outputs/${task_name},")
        assert hydra.sweep._get_node("dir")._value() == (
            "outputs/${task_name}-multirun/${now:%Y-%m-%d_%H-%M-%S}"
        )
    else:
        assert run_dir == "outputs/${task_name}/${now:%Y-%m-%d_%H-%M-%S}"


LOCAL = """\
datamodule:
  num_workers: 3
trainer:
  max_epochs: 7
accelerator: cpu
"""
"""A machine's ``local/default.yaml``: keys from the top of the config, no package line."""


@pytest.mark.parametrize("name", PRIMARY)
def test_a_local_file_is_read_by_every_command(tmp_path, name):
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "default.yaml").write_text(LOCAL)
    searched = f"hydra.searchpath=[file://{tmp_path}]"
    plain = compose_config(name)
    cfg = compose_config(name, [searched])
    assert cfg.accelerator == "cpu"
    if "datamodule" in plain:
        assert cfg.datamodule.num_workers == 3
    if "trainer" in plain:
        assert cfg.trainer.max_epochs == 7
        # The command line and a debug preset still win; an experiment preset does not.
        cfg = compose_config(name, [searched, "trainer.max_epochs=2"])
        assert cfg.trainer.max_epochs == 2
        assert compose_config(name, [searched, "debug=fast"]).trainer.max_epochs == 1
        preset = compose_config(name, [searched, f"experiment={PRESET}"])
        assert preset.trainer.max_epochs == 7 and preset.datamodule.batch_size == 20
    # Without the file, nothing of it.
    assert plain.get("accelerator") != "cpu"


def test_the_machines_local_file_is_not_committed_and_its_readme_is():
    def ignored(path: str) -> bool:
        check = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, check=False)
        assert check.returncode in (0, 1), check
        return check.returncode == 0

    assert ignored("conf/local/default.yaml") and ignored("conf/local/windows.yaml")
    assert not ignored("conf/local/README.md") and (REPO / "conf/local/README.md").is_file()


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
    page = (REPO / "docs/own-data.md").read_text()
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
