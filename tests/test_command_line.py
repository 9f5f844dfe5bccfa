"""Values quoted for another process's command line come back as they were through Hydra."""

import itertools

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from segscale.command_line import quoted_override

WINDOWS_PATHS = [
    r"C:\Users\me\data",
    r"D:\tiles",
    r"\\server\share\x",
    "D:\\tiles\\",  # a folder's trailing backslash: before the closing quote
    r"\\server\d$\my tiles",  # a hidden share, a space
]
AWKWARD = [
    '/data/it\'s a "quote", $HOME = 1',
    "/data/a b,c=d [x] {y} (z) ~+@:",
    r"C:\it's\"",
    "\\'",
    '\\\\"',
    "",
    "null",
    "1e3",
    "true",
    "Straße/水",
]


def parsed(value: str) -> object:
    """What Hydra 1.3's override parser reads from ``key=<value quoted>``."""
    return OverridesParser.create().parse_override(f"key={quoted_override(value)}").value()


@pytest.mark.parametrize("value", WINDOWS_PATHS + AWKWARD)
def test_hydra_reads_back_what_was_quoted(value):
    assert parsed(value) == value


def test_windows_paths_are_written_as_they_are():
    for path in WINDOWS_PATHS[:3]:
        assert quoted_override(path) == f"'{path}'"  # no doubled backslashes


def test_every_short_string_of_backslashes_quotes_and_letters_comes_back():
    parser = OverridesParser.create()
    for length in range(6):  # 1365 strings, in 1 s
        for chars in itertools.product("\\'\"a", repeat=length):
            value = "".join(chars)
            override = parser.parse_override(f"key={quoted_override(value)}")
            assert override.value() == value, quoted_override(value)
