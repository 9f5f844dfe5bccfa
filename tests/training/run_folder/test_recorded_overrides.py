"""A run folder's recorded overrides are restored as values, never as code: an allow-list."""

import re
from pathlib import Path

import pytest
import yaml

from segscale.errors import ConfigError
from segscale.training.run_folder import relaunch
from segscale.training.run_folder.recorded_overrides import MAX_LINE, restorable_overrides
from segscale.training.run_folder.relaunch import restore_overrides

# Recorded as a user typed them → restored as segscale writes them.
LEGITIMATE = {
    "model=unet": "model=unet",
    "datamodule/classes=potsdam": "datamodule/classes=potsdam",
    "callbacks=[default]": "callbacks=[default]",
    "experiment=null": "experiment=null",
    "datamodule.batch_size=2": "datamodule.batch_size=2",
    "datamodule.source.root='/data/my tiles'": "datamodule.source.root='/data/my tiles'",
    "datamodule.source.root=/data/tiles": "datamodule.source.root='/data/tiles'",
    'datamodule.source.root="/data/it\'s"': 'datamodule.source.root="/data/it\'s"',
    "datamodule.mean=[1.0,2.0,3.0]": "datamodule.mean=[1.0,2.0,3.0]",
    "datamodule.mean.0=0.5": "datamodule.mean.0=0.5",
    "optimizer.lr=1e-3": "optimizer.lr=0.001",
    "training.gradient_threshold=inf": "training.gradient_threshold=inf",
    "trainer.devices=[0,1]": "trainer.devices=[0,1]",
    "trainer.precision=bf16-mixed": "trainer.precision='bf16-mixed'",
    "callbacks.early_stopping=null": "callbacks.early_stopping=null",
    "training.sync_batchnorm=false": "training.sync_batchnorm=false",
    "seed=str(3)": "seed='3'",
    # Windows paths: typed bare, quoted, or escaped as a sweep's job records them.
    r"datamodule.source.root=C:\Users\me\data": r"datamodule.source.root='C:\Users\me\data'",
    r"datamodule.source.root='D:\tiles\\'": r"datamodule.source.root='D:\tiles\\'",
    r"datamodule.source.root='\\server\share\x'": r"datamodule.source.root='\\server\share\x'",
    r"datamodule.source.root=C\:\\Users\\me": r"datamodule.source.root='C:\Users\me'",
    r"datamodule.source.root='\\srv\d$\my, 2'": r"datamodule.source.root='\\srv\d$\my, 2'",
}


def records(tmp_path: Path, *lines: str) -> Path:
    """An ``overrides.yaml`` of ``lines``, written as Hydra writes it."""
    path = tmp_path / "overrides.yaml"
    path.write_text(yaml.safe_dump(list(lines)))
    return path


def restored(path: Path, given: list[str], config_dirs: tuple[Path, ...] = ()) -> list[str]:
    return [r.text for r in restorable_overrides(path, given, config_dirs)]


def test_values_and_options_are_restored_as_segscale_writes_them(tmp_path):
    path = records(tmp_path, *LEGITIMATE, "ckpt_path=null")
    assert restored(path, ["ckpt_path=last"]) == list(LEGITIMATE.values())


# Each line, appended to a record, would run code, reach outside the run or change what
# the resume is; none may be restored. The first two ran builtins.print under the
# substring check this allow-list replaced.
ATTACKS = [
    (
        """+callbacks.pwn='${oc.${oc.select:nx,create}:"{_tar${oc.select:nx,get_}: """
        """builtins.print, _ar${oc.select:nx,gs_}: [X]}"}'""",
        "adds a key",
    ),
    ("+model@callbacks.pwn=../../../../elsewhere/evil", "adds a key"),
    ("model@callbacks.pwn=unet", "places a config with @package"),
    (
        """callbacks.model_checkpoint.filename='${oc.${oc.select:nx,create}:"{a: 1}"}'""",
        "'${' (an interpolation)",
    ),
    ("callbacks.model_checkpoint.filename=${oc.env:HOME}", "'${' (an interpolation)"),
    ("seed='${oc.decode:${oc.env:SEED}}'", "'${' (an interpolation)"),
    ("seed=${oc.decode:'${oc.env:SEED}'}", "is not an override Hydra reads"),
    ("datamodule.source.root='a\\${oc.env:X}'", "'${' (an interpolation)"),
    ("seed=str(${oc.env:SEED})", "'${' (an interpolation)"),
    ("datamodule.source.root='C:\\$${oc.env:X}'", "'${' (an interpolation)"),
    ("datamodule.source.root='C:\\\\${oc.env:X}'", "'${' (an interpolation)"),
    (r"datamodule.source.root=C\:\\$\{x\}", "'${' (an interpolation)"),
    ("callbacks.model_checkpoint._target_=numpy.savetxt", "not a plain config key"),
    ("optimizer._target_=builtins.print", "not a plain config key"),
    ("callbacks.early_stopping._partial_=true", "not a plain config key"),
    ("callbacks.early_stopping={_target_: numpy.savetxt, fname: /tmp/x}", "has a dict value"),
    ("+callbacks.evil._target_=numpy.savetxt", "adds a key"),
    ("++callbacks.evil._target_=numpy.savetxt", "adds a key"),
    ("~callbacks.model_checkpoint", "deletes a key"),
    ("hydra.job.env_set.LD_PRELOAD=/tmp/evil.so", "sets Hydra's own settings"),
    ("hydra.searchpath=[file:///tmp]", "sets Hydra's own settings"),
    ("hydra/launcher=parallel", "sets Hydra's own settings"),
    ("hydra/job_logging=none", "sets Hydra's own settings"),
    ("datamodule=../../../../../tmp/evil", "not an option of the config group 'datamodule'"),
    ("callbacks=[default,../../x]", "not an option of the config group 'callbacks'"),
    ("loss=nothere", "not an option of the config group 'loss'"),
    ("datamodule/classes=../potsdam", "not an option of the config group 'datamodule/classes'"),
    ("datamodule/nothere=x", "not a config group"),
    ("datamodule/../../x=y", "is not an override Hydra reads"),
    ("seed=1,2", "is a sweep"),
    ("seed=range(1,3)", "is a sweep"),
    ("seed=choice(1,2)", "is a sweep"),
    ("datamodule.source.root='/a\u2028b'", "control or separator character"),
    ("datamodule.source.root='/a\u0000b'", "control or separator character"),
    ("""datamodule.source.root="/it's a \\"quote\\"\"""", "both kinds of quotes"),
    ("seed=[[[[1]]]]", "has a list value"),
    ("datamodule.source.root=" + "a" * (MAX_LINE + 1), f"longer than {MAX_LINE}"),
]


@pytest.mark.parametrize(("line", "reason"), ATTACKS)
def test_anything_else_is_refused_naming_file_line_and_why(tmp_path, line, reason):
    path = records(tmp_path, "model=unet", "seed=3", line)
    expected = rf"{re.escape(str(path))}:3: the recorded override .*{re.escape(reason)}"
    with pytest.raises(ConfigError, match=expected) as refused:
        restorable_overrides(path, ["ckpt_path=last", "model=unet"])
    assert "give it again on the command line" in str(refused.value)


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\n",
        "- [1, 2]\n",
        "- {a: 1}\n",
        "- 'x\n",
        "- 'a=(\n",
        "- 5\n",  # not a string
        "- !!python/object/apply:os.system ['touch /tmp/x']\n",
        "- !!binary c2VlZD0z\n",
        "- |\n  seed=1\n  model=unet\n",  # two lines in one entry
        '- "seed\'=1"\n',
        '- "callbacks.a\\nb=1"\n',
    ],
)
def test_a_record_that_is_not_a_list_of_overrides_is_refused(tmp_path, text):
    path = tmp_path / "overrides.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        restorable_overrides(path, [])


def test_a_huge_record_is_refused_unread(tmp_path):
    path = tmp_path / "overrides.yaml"
    path.write_text("- seed=1\n" * 200_000)
    with pytest.raises(ConfigError, match=r"is not a launch record train\.py writes"):
        restorable_overrides(path, [])


def test_what_the_command_line_gives_again_or_deletes_is_not_restored_so_not_refused(tmp_path):
    own = "+callbacks.mine._target_=lightning.pytorch.callbacks.Timer"
    lines = [own, "+callbacks.other._target_=x.Y", "+callbacks.other.a=1", "seed=3"]
    path = records(tmp_path, *lines, "ckpt_path=/old/last.ckpt")
    given = [own, "~callbacks.other", "ckpt_path=last"]
    assert restored(path, given) == ["seed=3"]


def test_a_package_given_is_another_key_than_the_recorded_group(tmp_path):
    path = records(tmp_path, "model=unet", "seed=3")
    assert restored(path, ["model@aux=fpn"]) == ["model=unet", "seed=3"]
    assert restored(path, ["model=fpn"]) == ["seed=3"]


def test_a_group_option_of_the_users_own_config_folder_counts(tmp_path):
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text("# @package _global_\n")
    path = records(tmp_path, "experiment=mine")
    with pytest.raises(ConfigError, match="not an option of the config group 'experiment'"):
        restorable_overrides(path, [])
    assert restored(path, [], (tmp_path / "conf",)) == ["experiment=mine"]


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
    # --config-dir counts too, and is searched when the restored config is composed.
    with_dir = restore_overrides(["train.py", "--config-dir", str(tmp_path / "conf"), ckpt])
    assert with_dir[3:5] == ["experiment=mine", "seed=3"]
