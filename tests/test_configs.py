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
