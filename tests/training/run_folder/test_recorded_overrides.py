"""A run folder's recorded overrides are restored as values, never as code."""

import re
from pathlib import Path

import pytest
import yaml

from segscale.errors import ConfigError
from segscale.training.run_folder import relaunch
from segscale.training.run_folder.recorded_overrides import read_recorded_overrides
from segscale.training.run_folder.relaunch import restore_overrides

LEGITIMATE = [
    "model=unet",
    "datamodule/classes=potsdam",
    "datamodule.batch_size=2",
    "datamodule.source.root='/data/my tiles'",
    "datamodule.mean=[1.0,2.0,3.0]",
    "callbacks.early_stopping=null",
    "+extra=1",
    "~gone",
    "ckpt_path=null",
]


def records(tmp_path: Path, *lines: str) -> Path:
    """An ``overrides.yaml`` of ``lines``, written as Hydra writes it."""
    path = tmp_path / "overrides.yaml"
    path.write_text(yaml.safe_dump(list(lines)))
    return path


def test_values_are_restored_as_they_were_recorded(tmp_path):
    path = records(tmp_path, *LEGITIMATE)
    assert read_recorded_overrides(path, ["ckpt_path=last"]) == LEGITIMATE


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("+callbacks.evil._target_=numpy.savetxt", "names _target_"),
        ("+callbacks.evil={_target_: numpy.savetxt, fname: /tmp/x, X: [1]}", "names _target_"),
        ("+callbacks.model_checkpoint._args_=[1]", "names _args_"),
        ("+callbacks.early_stopping._partial_=true", "names _partial_"),
        ("+callbacks.evil='${oc.decode:\"{a: 1}\"}'", "uses oc.decode"),
        ("hydra.job.env_set.LD_PRELOAD=/tmp/evil.so", "sets Hydra's own settings"),
        ("hydra.searchpath=[file:///tmp]", "sets Hydra's own settings"),
        ("hydra/launcher=parallel", "sets Hydra's own settings"),
        ("model=../../../../../tmp/evil", "not an option of the config group 'model'"),
        ("callbacks=[default,../../x]", "not an option of the config group 'callbacks'"),
    ],
)
def test_code_and_hydra_settings_are_refused_naming_file_and_line(tmp_path, line, reason):
    path = records(tmp_path, "model=unet", "seed=3", line)
    expected = rf"{re.escape(str(path))}:3: the recorded override .*{re.escape(reason)}"
    with pytest.raises(ConfigError, match=expected) as refused:
        read_recorded_overrides(path, ["ckpt_path=last"])
    assert "give it again on the command line" in str(refused.value)


def test_what_the_command_line_gives_again_or_deletes_is_not_restored_so_not_refused(tmp_path):
    own = "+callbacks.mine._target_=lightning.pytorch.callbacks.Timer"
    path = records(tmp_path, own, "+callbacks.other._target_=x.Y", "+callbacks.other.a=1")
    given = [own, "~callbacks.other", "ckpt_path=last"]
    assert len(read_recorded_overrides(path, given)) == 3  # merge_overrides drops them


def test_a_group_option_of_the_users_own_config_folder_counts(tmp_path):
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text("# @package _global_\n")
    path = records(tmp_path, "experiment=mine")
    with pytest.raises(ConfigError, match="not an option of the config group 'experiment'"):
        read_recorded_overrides(path, [])
    assert read_recorded_overrides(path, [], (tmp_path / "conf",)) == ["experiment=mine"]


@pytest.mark.parametrize("text", ["a: 1\n", "- [1, 2]\n", "- {a: 1}\n", "- 'x\n", "- 'a=(\n"])
def test_a_record_that_is_not_a_list_of_overrides_is_refused(tmp_path, text):
    path = tmp_path / "overrides.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        read_recorded_overrides(path, [])


def test_a_group_option_of_a_search_path_given_on_the_command_line_counts(tmp_path, monkeypatch):
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text("# @package _global_\n")
    run = tmp_path / "outputs" / "train" / "run1"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("seed: 42\n")
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["experiment=mine", "seed=3"]))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(relaunch, "_restored", None)  # what it notes stays in this test
    ckpt = f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"
    with pytest.raises(ConfigError, match=r"overrides\.yaml:1: .*'experiment'"):
        restore_overrides(["train.py", ckpt])
    searchpath = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    restored = restore_overrides(["train.py", ckpt, searchpath])
    assert restored[1:3] == ["experiment=mine", "seed=3"]
