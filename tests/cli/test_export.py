from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from segscale.cli.export import export, main
from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.inference.export.formats import load_exported
from tests.conftest import compose_config, oracle_checkpoint, oracle_image, oracle_process
from tests.helpers.in_process import run_in_process


def _config(*overrides: str):
    return compose_config("export", *overrides)


@pytest.mark.parametrize(("fmt", "name"), [("onnx", "oracle.onnx"), ("torchscript", "oracle.pt")])
def test_export_writes_the_checkpoint_named_file_into_the_run_folder(
    tmp_path: Path, fmt: str, name: str
):
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    cfg = _config(f"ckpt={ckpt}", f"format={fmt}", "returns=mask", f"output_dir={tmp_path / 'run'}")
    exported = export(cfg)
    assert exported.path == tmp_path / "run" / name
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [name]  # no temporary left
    assert exported.max_difference is not None and exported.max_difference <= 1e-4
    truth = np.random.default_rng(0).integers(0, 3, (1, 20, 30))
    image = oracle_image(truth[0]).transpose(2, 0, 1)[None]
    np.testing.assert_array_equal(load_exported(exported.path, fmt)(image), truth)


def test_output_names_the_file_and_a_folder_is_refused(tmp_path: Path):
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    common = (f"ckpt={ckpt}", "format=torchscript", "verify=false")
    exported = export(_config(*common, f"output={tmp_path / 'deep' / 'model.ts'}"))
    assert exported.path == tmp_path / "deep" / "model.ts" and exported.max_difference is None
    with pytest.raises(ConfigError, match=r"output=.* is a folder: expected the path of a file"):
        export(_config(*common, f"output={tmp_path}"))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("format=tflite", "format='tflite' is not allowed: expected one of"),
        ("dtype=int8", "dtype='int8' is not allowed"),
        ("returns=probabilities", "returns='probabilities' is not allowed"),
        ("verify=maybe", "verify='maybe' is not allowed"),
        ("ckpt={tmp}/missing.ckpt", r"ckpt=.*no such file; expected a .ckpt"),
        ("ckpt={tmp}/damaged.ckpt", r"ckpt=.*is not a checkpoint, or a truncated one"),
    ],
)
def test_bad_input_names_the_key(tmp_path: Path, override: str, message: str):
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    (tmp_path / "damaged.ckpt").write_bytes(np.random.default_rng(0).bytes(300))
    cfg = _config(f"ckpt={ckpt}", f"output_dir={tmp_path / 'run'}", override.format(tmp=tmp_path))
    with pytest.raises(ConfigError, match=message):
        export(cfg)
    assert not (tmp_path / "run").exists()


def _export_command(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``python export.py`` with its run folder under ``tmp_path``, run in this process
    (a process of its own would spend ~9 s importing)."""
    folder = f"hydra.run.dir={tmp_path / 'run'}"
    return run_in_process(main, folder, *overrides, cwd=tmp_path, program="export.py")


def _export_process(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``python export.py`` as a process of its own, its run folder under ``tmp_path``."""
    command = oracle_process("export.py", f"hydra.run.dir={tmp_path / 'run'}")
    return subprocess.run(
        [*command, *overrides], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )


BAD_INPUT = [
    ("format=tflite", "format='tflite' is not allowed"),
    ("ckpt={tmp}/missing.ckpt", "ckpt=.*no such file"),
]


@pytest.mark.parametrize(("override", "message"), BAD_INPUT)
def test_the_command_exits_2_with_one_line_on_bad_input(
    tmp_path: Path, override: str, message: str
):
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    result = _export_command(tmp_path, f"ckpt={ckpt}", override.format(tmp=tmp_path))
    _assert_refused(result, tmp_path, message)


@pytest.mark.slow
def test_an_export_py_process_exits_2_on_bad_input(tmp_path: Path):
    """One case of the above from ``python export.py`` itself: its exit status end to end."""
    override, message = BAD_INPUT[0]
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    result = _export_process(tmp_path, f"ckpt={ckpt}", override.format(tmp=tmp_path))
    _assert_refused(result, tmp_path, message)


def _assert_refused(result: subprocess.CompletedProcess, tmp_path: Path, message: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_BAD_INPUT, output[-3000:]
    assert "Traceback" not in output
    assert re.search(message, output), output[-3000:]
    assert not list((tmp_path / "run").glob("*.onnx"))


def test_the_command_writes_the_file(tmp_path: Path):
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    result = _export_command(tmp_path, f"ckpt={ckpt}", "format=torchscript")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert (tmp_path / "run" / "oracle.pt").is_file()
