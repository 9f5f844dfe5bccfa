import codecs
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from segscale.data.folder import FolderTiles
from segscale.data.list_files import read_list, resolve_listed
from segscale.errors import ConfigError


def _write(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


def _tiles(root: Path, stems: tuple[str, ...] = ("a", "b", "c")) -> Path:
    """``train/<stem>.png`` and ``trainannot/<stem>.png`` (CamVid's layout) under ``root``."""
    for stem in stems:
        _write(root / "train" / f"{stem}.png", np.zeros((8, 8, 3), np.uint8))
        _write(root / "trainannot" / f"{stem}.png", np.zeros((8, 8), np.uint8))
    return root


def _listed(root: Path, data: bytes) -> FolderTiles:
    (root / "lists").mkdir(exist_ok=True)
    (root / "lists/train.txt").write_bytes(data)
    return FolderTiles(str(root), splits={"train": {"list": "lists/train.txt"}})


def test_a_pair_list_written_on_windows_pairs_as_one_written_here(tmp_path: Path):
    _tiles(tmp_path)
    lines = [
        r"train\a.png trainannot\a.png",  # relative, backslashes
        r"D:\CamVid\train\b.png D:\CamVid\trainannot\b.png",  # another machine's drive
        r"\\server\share\CamVid\train\c.png trainannot/c.png",  # a share; forward slashes
    ]
    # Notepad's UTF-8 with a byte-order mark, and Windows' line ends
    text = codecs.BOM_UTF8 + "\r\n".join(lines).encode() + b"\r\n"
    pairs, problems = _listed(tmp_path, text).scan("train")
    assert problems == []
    assert [(p.image, p.mask) for p in pairs] == [
        (tmp_path / f"train/{s}.png", tmp_path / f"trainannot/{s}.png") for s in "abc"
    ]


@pytest.mark.parametrize("bom", [codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE])
def test_a_utf16_list_as_powershell_writes_it_is_read(tmp_path: Path, bom: bytes):
    _tiles(tmp_path)
    codec = "utf-16-le" if bom == codecs.BOM_UTF16_LE else "utf-16-be"
    text = bom + "train/a.png trainannot/a.png\r\n".encode(codec)
    pairs, problems = _listed(tmp_path, text).scan("train")
    assert problems == [] and [p.image.name for p in pairs] == ["a.png"]


def test_a_list_of_another_encoding_is_refused_naming_the_file(tmp_path: Path):
    _tiles(tmp_path)
    source = _listed(tmp_path, "train/a.png trainannot/a.png  # café\n".encode("cp1252"))
    with pytest.raises(ConfigError) as refused:
        source.scan("train")
    message = str(refused.value)
    assert str(tmp_path / "lists/train.txt") in message and "not UTF-8" in message


def test_a_windows_path_not_found_says_the_list_looks_written_on_windows(tmp_path: Path):
    _tiles(tmp_path, ("a",))
    text = b"train\\zzz.png trainannot\\zzz.png\nD:\\tiles\\nothing.png x.png\n"
    pairs, problems = _listed(tmp_path, text).scan("train")
    assert pairs == [] and len(problems) == 2
    for problem in problems:
        assert "looks written on Windows" in problem.reason
        assert "forward slashes" in problem.reason
    assert "train/zzz.png" in problems[0].reason  # the form it was looked for in
    (tmp_path / "lists/train.txt").write_text("train/zzz.png trainannot/zzz.png\n")
    _, problems = _listed(tmp_path, b"train/zzz.png trainannot/zzz.png\n").scan("train")
    assert "Windows" not in problems[0].reason  # no hint where nothing looks like Windows


def test_a_file_named_with_a_backslash_is_found_as_written_first(tmp_path: Path):
    # On Linux a backslash is a character of a name: the file that has it is the one meant.
    odd = _write(tmp_path / "train\\a.png", np.zeros((8, 8, 3), np.uint8))
    _tiles(tmp_path, ("a",))
    assert resolve_listed("train\\a.png", (tmp_path,)) == odd
    assert resolve_listed("train/a.png", (tmp_path,)) == tmp_path / "train/a.png"


def test_one_name_lines_written_on_windows_find_their_pair(tmp_path: Path):
    for name in ("zone1/a", "b"):
        _write(tmp_path / "images" / f"{name}.png", np.zeros((8, 8, 3), np.uint8))
        _write(tmp_path / "masks" / f"{name}.png", np.zeros((8, 8), np.uint8))
    source = _listed(tmp_path, codecs.BOM_UTF8 + b"zone1\\a\r\nb.png\r\n")
    pairs, problems = source.scan("train")
    assert problems == [] and [p.image.stem for p in pairs] == ["a", "b"]
    _, problems = _listed(tmp_path, b"zone2\\a\r\n").scan("train")
    assert "looks written on Windows" in problems[0].reason


def test_read_list_strips_the_byte_order_mark_and_windows_line_ends(tmp_path: Path):
    listing = tmp_path / "list.txt"
    listing.write_bytes(codecs.BOM_UTF8 + b"a.png b.png\r\n\r\n# note\r\nc.png\r\n")
    assert [(line.where.rsplit(":", 1)[1], line.fields) for line in read_list(listing)] == [
        ("1", ("a.png", "b.png")),
        ("4", ("c.png",)),
    ]
