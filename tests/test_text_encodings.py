"""Text is UTF-8, written and read: every text stream in src/ names its encoding.

Python's default is the locale's (cp1252 on most Windows machines, ASCII under ``LANG=C``):
a file written as UTF-8 and read without an encoding reads back garbled, or not at all.
ruff's ``PLW1514`` (pyproject.toml) catches the calls whose receiver it knows is a file;
this walks every call in src/ whatever its receiver, as an allow-list: a call that
opens a text stream must name its ``encoding``.
"""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

ALWAYS_TEXT = {"read_text", "write_text", "TextIOWrapper", "FileHandler"}
"""Calls that make or use a text stream whatever their arguments."""
OPENERS = {"open", "fdopen", "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"}
"""Calls that open a text stream unless their mode says binary (``b``)."""
CHILDREN = {"run", "Popen", "check_output", "check_call", "call"}
"""``subprocess`` calls, whose pipes are text streams with ``text=True``."""
NOT_FILES = {"os", "Image", "rasterio", "tifffile", "webbrowser", "tarfile", "zipfile"}
"""Receivers whose ``open`` is not a text file's: descriptors, images, archives."""
MODE = re.compile(r"[rwxabt+]+")
"""What a file's mode is made of (a literal among the first arguments that is not one is
something else: ``DecodeCache.open(path, "image", ...)``)."""


def call_name(call: ast.Call) -> tuple[str, str]:
    """The called name and what it is called on (``""`` for a plain name)."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id, ""
    if isinstance(func, ast.Attribute):
        receiver = func.value.id if isinstance(func.value, ast.Name) else "?"
        return func.attr, receiver
    return "", ""


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def opens_text(call: ast.Call, name: str, receiver: str) -> bool:
    """Whether ``call`` opens a text stream (its mode a literal without ``b``, or none)."""
    if name not in OPENERS or (name == "open" and receiver in NOT_FILES):
        return False
    mode = keyword(call, "mode")
    if mode is None:
        literals = [a for a in call.args[:2] if isinstance(a, ast.Constant)]
        mode = next((a for a in literals if MODE.fullmatch(str(a.value))), None)
    if mode is None:
        # No literal mode: Path.open() and open(path) default to text; an opener called
        # with a non-literal first argument (fsspec's fs.open(path)) to its own default.
        return name == "open" and (receiver == "" or not call.args)
    return isinstance(mode, ast.Constant) and "b" not in str(mode.value)


def pipes_text(call: ast.Call, name: str, receiver: str) -> bool:
    """Whether a ``subprocess`` call reads or writes its child's pipes as text."""
    if name not in CHILDREN or receiver != "subprocess":
        return False
    for flag in ("text", "universal_newlines"):
        value = keyword(call, flag)
        if value is not None and not (isinstance(value, ast.Constant) and not value.value):
            return True
    return False


def unencoded_text_streams(source: str) -> list[int]:
    """The lines of ``source`` that open a text stream without naming its encoding."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or keyword(node, "encoding") is not None:
            continue
        name, receiver = call_name(node)
        text = name in ALWAYS_TEXT and receiver not in NOT_FILES
        if text or opens_text(node, name, receiver) or pipes_text(node, name, receiver):
            lines.append(node.lineno)
    return lines


def test_every_text_stream_in_src_names_its_encoding():
    found = {
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted(SRC.rglob("*.py"))
        for line in unencoded_text_streams(path.read_text(encoding="utf-8"))
    }
    assert not found, f"text streams without encoding=... (UTF-8, always): {sorted(found)}"


def test_the_check_finds_what_it_looks_for():
    found = """
from pathlib import Path
import subprocess
path.read_text()
(folder / NAME).write_text(text)
open(path)
open(path, "w", newline="")
path.open()
path.open("a")
self._fs.open(path, "r", newline="")
os.fdopen(fd, "w")
tempfile.NamedTemporaryFile("w")
io.TextIOWrapper(stream)
logging.FileHandler(name)
subprocess.run(command, text=True)
subprocess.Popen(command, universal_newlines=True)
"""
    assert unencoded_text_streams(found) == list(range(4, 17))
    fine = """
path.read_text(encoding="utf-8")
open(path, "rb")
path.open("wb")
open(path, mode="rb+")
os.open(path, os.O_RDONLY)
Image.open(path)
rasterio.open(path, sharing=False)
self._fs.open(path)
subprocess.run(command, capture_output=True)
subprocess.run(command, text=True, encoding="utf-8", errors="replace")
subprocess.run(command, text=False)
"""
    assert unencoded_text_streams(fine) == []


def in_ascii_locale(part: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """``tests/helpers/utf8_readers.py <part>`` in a Python whose locale encoding is ASCII."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONUTF8"))}
    env |= {"LC_ALL": "C", "LANG": "C", "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [
        sys.executable,
        "-X",
        "utf8=0",
        "-m",
        "tests.helpers.utf8_readers",
        part,
        str(folder),
    ]
    done = subprocess.run(
        command, env=env, cwd=SRC.parent, capture_output=True, text=True, encoding="utf-8"
    )
    assert "locale encoding: ANSI_X3.4-1968" in done.stdout, done.stdout + done.stderr
    return done


def test_summaries_and_sweep_records_read_back_in_a_locale_that_is_not_utf8(tmp_path):
    done = in_ascii_locale("light", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_the_csv_logger_and_image_metrics_write_and_read_utf8_in_any_locale(tmp_path):
    done = in_ascii_locale("heavy", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
