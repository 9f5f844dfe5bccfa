import codecs
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from segscale.errors import ConfigError
from segscale.inference.prediction.inputs import input_images


def _images(folder: Path, names: tuple[str, ...]) -> list[Path]:
    paths = []
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(path)
        paths.append(path)
    return paths


def test_an_input_list_written_on_windows_names_the_images_meant(tmp_path: Path):
    a, b = _images(tmp_path, ("tiles/a.png", "tiles/b.png"))
    listing = tmp_path / "inputs.txt"
    listing.write_bytes(codecs.BOM_UTF8 + b"tiles\\a.png\r\nD:\\survey\\tiles\\b.png\r\n")
    assert input_images(str(listing)) == [a, b]


def test_a_utf16_input_list_is_read(tmp_path: Path):
    (a,) = _images(tmp_path, ("a.png",))
    listing = tmp_path / "inputs.txt"
    listing.write_bytes(codecs.BOM_UTF16_LE + "a.png\r\n".encode("utf-16-le"))
    assert input_images(str(listing)) == [a]


def test_a_windows_line_not_found_says_what_form_is_expected(tmp_path: Path):
    _images(tmp_path, ("a.png",))
    listing = tmp_path / "inputs.txt"
    listing.write_text("a.png\nD:\\tiles\\gone.png\n")
    with pytest.raises(ConfigError) as refused:
        input_images(str(listing))
    message = str(refused.value)
    assert "gone.png" in message and "looks written on Windows" in message
    listing.write_text("a.png\nD:/tiles/gone.png\n")
    with pytest.raises(ConfigError, match="looks written on Windows"):
        input_images(str(listing))
    listing.write_text("a.png\ngone.png\n")
    with pytest.raises(ConfigError, match="missing") as refused:
        input_images(str(listing))
    assert "Windows" not in str(refused.value)


def test_an_input_list_of_another_encoding_is_refused_naming_it(tmp_path: Path):
    listing = tmp_path / "inputs.txt"
    listing.write_bytes("café.png\n".encode("cp1252"))
    with pytest.raises(ConfigError, match=r"inputs.txt: not UTF-8 text"):
        input_images(str(listing))
