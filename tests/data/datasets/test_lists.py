import codecs
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from segscale.configs import compose_config
from segscale.data.checks.dataset_problems import InvalidDatasetError
from segscale.data.datasets.folder import FolderTiles
from segscale.data.datasets.lists import read_list, resolve_listed, split_fields
from segscale.errors import ConfigError
from segscale.training.run.inferred_classes import resolve_inferred_classes


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


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        (
            '"Tile 1/images/a.jpg" "Tile 1/masks/a.png"',
            ("Tile 1/images/a.jpg", "Tile 1/masks/a.png"),
        ),
        (
            "'Tile 1/images/a.jpg'  'Tile 1/masks/a.png'",
            ("Tile 1/images/a.jpg", "Tile 1/masks/a.png"),
        ),
        ("Tile 1/images/a.jpg\tTile 1/masks/a.png", ("Tile 1/images/a.jpg", "Tile 1/masks/a.png")),
        ("  Tile 1/a.jpg  \t\t Tile 1/a.png \t# a comment", ("Tile 1/a.jpg", "Tile 1/a.png")),
        ('"Tile 1/a.jpg"\t"Tile 1/a.png"', ("Tile 1/a.jpg", "Tile 1/a.png")),
        ("O'Brien.png masks/O'Brien.png", ("O'Brien.png", "masks/O'Brien.png")),  # a letter
        ('"a # b.png" c.png # comment', ("a # b.png", "c.png")),
        ('"a.png"# comment', ("a.png",)),
        ("D:\\CamVid\\train\\a.png x.png", ("D:\\CamVid\\train\\a.png", "x.png")),  # no escapes
        ("a.png b.png", ("a.png", "b.png")),
    ],
)
def test_a_lines_fields_are_read_in_quotes_between_tabs_or_between_spaces(line, fields):
    assert split_fields(line) == (fields, split_fields(line)[1], "")


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('"Tile 1/a.jpg Tile 1/a.png', 'the quote " at column 1 is not closed'),
        ("a.png 'b.png", "the quote ' at column 7 is not closed"),
        ('"Tile 1"/a.jpg b.png', "'/a.jpg' follows the closing quote at column 8"),
    ],
)
def test_a_quote_left_open_or_followed_by_more_is_the_lines_problem(line, problem):
    assert split_fields(line)[2].startswith(problem)


def _spaced(root: Path) -> None:
    """CamVid's layout in a folder whose name has a space: ``CamVid 2/train/a.png``, ..."""
    for stem in ("a", "b", "c"):
        _write(root / "CamVid 2/train" / f"{stem}.png", np.zeros((8, 8, 3), np.uint8))
        _write(root / "CamVid 2/trainannot" / f"{stem}.png", np.zeros((8, 8), np.uint8))


def test_paths_with_spaces_pair_in_quotes_or_separated_by_tabs(tmp_path: Path):
    _spaced(tmp_path)
    text = (
        '"CamVid 2/train/a.png" "CamVid 2/trainannot/a.png"\n'
        "CamVid 2/train/b.png\tCamVid 2/trainannot/b.png\n"
        f"'{tmp_path}/CamVid 2/train/c.png'\t'/elsewhere/CamVid 2/trainannot/c.png'\n"
    )
    pairs, problems = _listed(tmp_path, text.encode()).scan("train")
    assert problems == []
    assert [(p.image, p.mask) for p in pairs] == [
        (tmp_path / f"CamVid 2/train/{s}.png", tmp_path / f"CamVid 2/trainannot/{s}.png")
        for s in "abc"
    ]


def test_unquoted_spaces_and_open_quotes_are_problems_of_their_lines_all_listed(tmp_path: Path):
    _spaced(tmp_path)
    text = (
        "CamVid 2/train/a.png CamVid 2/trainannot/a.png\n"
        '"CamVid 2/train/b.png" "CamVid 2/trainannot/b.png\n'
        '"CamVid 2/train/c.png" "CamVid 2/trainannot/c.png"\n'
        "CamVid 2/train/b.png\n"  # two fields: an image 'CamVid' and a mask '2/train/b.png'
    )
    pairs, problems = _listed(tmp_path, text.encode()).scan("train")
    assert [p.image.name for p in pairs] == ["c.png"]
    assert [str(p.path).rsplit(":", 1)[1] for p in problems] == ["1", "2", "4"]
    assert problems[0].reason == (
        "4 fields; expected an image name, or an image path and its mask path (a path with "
        'spaces goes in quotes ("Tile 1/images/a.jpg" "Tile 1/masks/a.png"), or the '
        "line's fields are separated by a tab)"
    )
    assert problems[1].reason.startswith('the quote " at column 24 is not closed')
    assert problems[2].reason.endswith(
        "; 'CamVid 2/train/b.png' is there: a path with spaces goes in quotes "
        '("Tile 1/images/a.jpg" "Tile 1/masks/a.png"), or the line\'s fields are separated '
        "by a tab"
    )
    _, problems = _listed(tmp_path, b"zzz.png yyy.png\n").scan("train")
    assert "is there" not in problems[0].reason  # no hint where no path has a space


def test_classes_auto_refusing_the_train_list_lists_the_val_lists_bad_lines_too(tmp_path: Path):
    _spaced(tmp_path)
    for split in ("train", "val"):
        (tmp_path / f"{split}.txt").write_text(
            "CamVid 2/train/a.png CamVid 2/trainannot/a.png\n'CamVid 2/train/b.png\n"
        )
    cfg = compose_config(
        "train",
        ["datamodule=folder", f"datamodule.source.root={tmp_path}", "datamodule/classes=auto"],
    )
    with pytest.raises(InvalidDatasetError) as refused:
        resolve_inferred_classes(cfg)
    message = str(refused.value)
    assert message.startswith("4 problem(s) in the dataset")
    for split in ("train", "val"):
        for number in (1, 2):
            assert f"{tmp_path}/{split}.txt:{number}: " in message
