import pytest
from omegaconf import OmegaConf, open_dict

from segscale.cli.train import main
from segscale.errors import ConfigError
from segscale.training.run.config_checks import check_config
from tests.conftest import compose_config
from tests.helpers.in_process import run_in_process

MOVED = r"strategy\.sync_batchnorm is now training\.sync_batchnorm"


@pytest.mark.parametrize(
    ("override", "new"),
    [
        ("strategy.sync_batchnorm=false", "training.sync_batchnorm"),
        ("+strategy.sync_batchnorm=1", "training.sync_batchnorm"),
        ("training.preemption_exit_s=30", "training.preemption_deadline_s"),
    ],
)
def test_train_py_refuses_the_old_key_with_one_line_naming_the_new(tmp_path, override, new):
    # train.py's entry point in this process: python train.py would spend ~9 s importing.
    result = run_in_process(main, override, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{new}=..." in lines[0], result.stderr
    assert not (tmp_path / "run").exists()


def test_a_preset_that_still_sets_the_old_key_is_refused():
    cfg = compose_config("train")
    with open_dict(cfg):
        cfg.strategy.sync_batchnorm = True  # as a user's own conf/strategy/*.yaml would
    with pytest.raises(ConfigError, match=MOVED):
        check_config(cfg)


def test_the_strategy_group_is_lightnings_strategy_alone():
    for option in ("ddp", "ddp_spawn", "single"):
        strategy = compose_config("train", f"strategy={option}").strategy
        assert "sync_batchnorm" not in strategy, option
    assert OmegaConf.select(compose_config("train"), "training.sync_batchnorm") is True


def test_a_run_recorded_with_the_old_key_resumes_with_its_value_under_the_new_name():
    from segscale.moved_keys import renamed_overrides

    recorded = ["strategy.sync_batchnorm=false", "+strategy.sync_batchnorm=true", "optimizer.lr=1"]
    assert renamed_overrides(recorded) == [
        "training.sync_batchnorm=false",
        "training.sync_batchnorm=true",  # the new key exists: set, not added
        "optimizer.lr=1",
    ]


@pytest.mark.parametrize("program", ["predict", "evaluate"])
@pytest.mark.parametrize("override", ["inference.flip_tta=true", "+inference.flip_tta=false"])
def test_predict_and_evaluate_refuse_flip_tta_naming_inference_tta(tmp_path, program, override):
    from segscale.cli import evaluate, predict

    main = {"predict": predict.main, "evaluate": evaluate.main}[program]
    out = tmp_path / "out"
    result = run_in_process(
        main, "ckpt=x.ckpt", override, f"hydra.run.dir={out}", cwd=tmp_path, program=program
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "inference.tta=..." in lines[0], result.stderr
    assert "tta=flip" in lines[0] and not out.exists()
