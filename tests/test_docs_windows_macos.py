r"""The Windows and macOS page (docs/windows-macos.md): its commands work as written.

Each command of the page is read as its shell reads it, then as Hydra reads it: bash
through ``shlex`` (POSIX quoting); cmd.exe, which hands the line on as it is, through
the rules by which a Windows program's C runtime (Python's too) splits its command line
into arguments; PowerShell through its argument mode's quoting (``'...'`` as it is,
``"..."`` with backtick escapes, quoted parts joined to their word), whose arguments a
program receives as they are. Each override must parse with Hydra's override parser,
the paths of the table must come back as the folder of their row in every shell, and
each whole command must compose with the config of its script. Composing only: nothing
runs. The signals the page states are the platform module's.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException

from segscale.configs import compose_config
from segscale.platforms.signals import StopSignalError, default_preemption_signals, stop_signal_name

PAGE = Path(__file__).resolve().parents[1] / "docs" / "windows-macos.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SCRIPTS = {"train", "predict", "evaluate", "bench", "data", "export"}


def crt_split(line: str) -> list[str]:
    """``line`` split as a Windows program's C runtime splits its command line.

    Spaces and tabs outside double quotes separate arguments; ``2n`` backslashes before
    a ``"`` are ``n`` backslashes and the quote opens or closes, ``2n+1`` are ``n`` and a
    literal ``"``; backslashes before anything else are themselves; ``""`` inside quotes
    is a literal ``"``.
    """
    args: list[str] = []
    current: list[str] = []
    started = quoted = False
    i = 0
    while i < len(line):
        c = line[i]
        if c in " \t" and not quoted:
            if started:
                args.append("".join(current))
                current, started = [], False
            i += 1
            continue
        started = True
        if c == "\\":
            n = len(line[i:]) - len(line[i:].lstrip("\\"))
            i += n
            if i < len(line) and line[i] == '"':
                current.append("\\" * (n // 2))
                if n % 2:
                    current.append('"')
                    i += 1
            else:
                current.append("\\" * n)
            continue
        if c == '"':
            if quoted and line[i + 1 : i + 2] == '"':
                current.append('"')
                i += 2
                continue
            quoted = not quoted
            i += 1
            continue
        current.append(c)
        i += 1
    if started:
        args.append("".join(current))
    return args


def cmd_split(line: str) -> list[str]:
    """The arguments a program started from cmd.exe with ``line`` receives."""
    # cmd.exe expands %VARIABLES% and reads ^ & | < > itself: none on the page is modelled.
    assert not set("%^&|<>") & set(line), f"cmd.exe would read this line itself: {line}"
    return crt_split(line)


def powershell_split(line: str) -> list[str]:
    """The arguments a program started from PowerShell with ``line`` receives."""
    args: list[str] = []
    current: str | None = None
    i = 0
    while i < len(line):
        c = line[i]
        if c in " \t":
            if current is not None:
                args.append(current)
                current = None
            i += 1
            continue
        current = current or ""
        if c == "'":  # verbatim; '' is a quote
            end = i + 1
            while True:
                end = line.index("'", end)
                if line[end + 1 : end + 2] != "'":
                    break
                end += 2
            current += line[i + 1 : end].replace("''", "'")
            i = end + 1
        elif c == '"':  # expandable: backtick escapes; no $ expansion is modelled
            end = i + 1
            while line[end] != '"':
                assert line[end] != "$", f"PowerShell would expand $ in: {line}"
                end += 2 if line[end] == "`" else 1
            current += re.sub("`(.)", r"\1", line[i + 1 : end])
            i = end + 1
        else:
            assert c not in "`$#;|&(){}@<>,", f"PowerShell would read {c!r} itself: {line}"
            current += c
            i += 1
    if current is not None:
        args.append(current)
    # Windows PowerShell 5.1 passes a '"' inside an argument on wrongly; none may hold one.
    assert not any('"' in a for a in args), f"an argument holds a double quote: {line}"
    return args


SHELLS: dict[str, Callable[[str], list[str]]] = {
    "bat": cmd_split,
    "powershell": powershell_split,
    "bash": lambda line: shlex.split(line, comments=True),
}
COLUMNS = {"cmd.exe": "bat", "PowerShell": "powershell"}
"""The page's table columns and their shells (the bash column's name starts with bash)."""


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def parsed(overrides: list[str]) -> dict[str, object]:
    """``{key: value}`` as Hydra's override parser reads ``overrides``."""
    return {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(overrides)}


def commands(after: str = "") -> list[tuple[str, list[str]]]:
    """Each ``python <script>.py ...`` line of the page's code blocks (after the text
    ``after``): (shell, arguments)."""
    found = []
    text = page()
    for shell, body in FENCE.findall(text[text.index(after) :]):
        for line in body.splitlines():
            if line.startswith("python "):
                assert shell in SHELLS, f"a command in a {shell} block: {line}"
                found.append((shell, SHELLS[shell](line)))
    return found


def path_table() -> list[dict[str, str]]:
    """The rows of the table of folders, each ``{column: cell}`` with the backticks off."""
    lines = [line for line in page().splitlines() if line.startswith("|")]
    start = next(i for i, line in enumerate(lines) if line.startswith("| the folder |"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if not cells[0].startswith("`"):
            break
        rows.append({h: c.strip("`") for h, c in zip(header, cells, strict=True)})
    return rows


def shell_of(column: str) -> Callable[[str], list[str]]:
    return SHELLS["bash" if column.startswith("bash") else COLUMNS[column]]


def test_the_argument_splitting_is_the_c_runtimes():
    # Microsoft's examples of how a C program reads its command line ("Parsing C
    # command-line arguments"): what the cmd.exe model stands on.
    assert crt_split('"a b c" d e') == ["a b c", "d", "e"]
    assert crt_split(r'"ab\"c" "\\" d') == ['ab"c', "\\", "d"]
    assert crt_split(r'a\\\b d"e f"g h') == [r"a\\\b", "de fg", "h"]
    assert crt_split(r"a\\\"b c d") == [r"a\"b", "c", "d"]
    assert crt_split(r'a\\\\"b c" d e') == [r"a\\b c", "d", "e"]
    assert crt_split('"a""b" c') == ['a"b', "c"]


def test_powershells_quotes_are_taken_off_and_joined_to_their_word():
    assert powershell_split("""a='b c' "d e" f''g 'it''s'""") == ["a=b c", "d e", "fg", "it's"]
    with pytest.raises(AssertionError, match="expand"):
        powershell_split('"$env:USERPROFILE"')


def test_every_folder_of_the_table_reaches_hydra_as_it_is_in_every_shell():
    rows = path_table()
    assert len(rows) >= 5
    for row in rows:
        folder = row["the folder"]
        for column, typed in row.items():
            if column == "the folder":
                continue
            args = shell_of(column)(typed)
            assert len(args) == 1, f"{column}: {typed} is {len(args)} arguments"
            assert parsed(args) == {"datamodule.source.root": folder}, f"{column}: {typed}"


def test_a_plain_path_goes_unquoted_in_cmd_and_powershell_but_not_in_bash():
    text = " ".join(page().split())
    found = re.search(r"without any quotes in cmd and PowerShell \(`([^`]+)`\), not in bash", text)
    assert found, "the page no longer shows a plain path without quotes"
    plain = found.group(1)
    (path,) = parsed([plain]).values()
    assert "\\" in str(path)
    assert (
        parsed(cmd_split(plain)) == parsed(powershell_split(plain)) == {plain.split("=")[0]: path}
    )
    assert parsed(shlex.split(plain)) != {plain.split("=")[0]: path}  # bash takes its backslashes


def test_a_double_quoted_argument_that_ends_in_a_backslash_runs_on_in_cmd():
    # The page's warning: "...=D:\tiles\" is read with a quote at its end.
    assert crt_split(r'"datamodule.source.root=D:\tiles\" x') == [
        r'datamodule.source.root=D:\tiles" x'
    ]


def test_every_command_of_the_page_parses_and_composes():
    found = commands()
    assert {shell for shell, _ in found} == set(SHELLS)
    composed: set[tuple[str, ...]] = set()
    for shell, args in found:
        assert args[0] == "python" and args[1].endswith(".py"), args
        script = args[1].removesuffix(".py")
        assert script in SCRIPTS, args
        parsed(args[2:])
        if tuple(args) in composed:  # cmd's and PowerShell's lines give the same arguments
            continue
        try:
            compose_config(script, args[2:])
        except HydraException as error:
            pytest.fail(f"{shell}: {shlex.join(args)} does not compose: {error}")
        composed.add(tuple(args))


def test_the_whole_commands_give_each_shell_the_same_values():
    by_shell: dict[str, list[dict[str, object]]] = {}
    for shell, args in commands(after="Whole commands:"):
        by_shell.setdefault(shell, []).append(parsed(args[2:]))
    whole = {shell: lines[:2] for shell, lines in by_shell.items()}
    assert whole["bat"] == whole["powershell"] == whole["bash"], whole
    train, predict = whole["bat"]
    assert train["datamodule.source.root"] == r"C:\Users\me\my data"
    assert predict == {"ckpt": r"C:\Users\me\runs\best.ckpt", "input": r"\\server\share\x"}


def test_the_commands_in_the_pages_text_parse_and_compose():
    text = FENCE.sub("", page())
    inline = [c for c in re.findall(r"`(python [^`]+)`", text) if "..." not in c]
    assert inline
    for command in inline:
        args = shlex.split(command.partition(" > ")[0])  # a redirection is the shell's
        compose_config(args[1].removesuffix(".py"), args[2:])


@pytest.mark.parametrize(("platform", "row"), [("win32", "Windows"), ("linux", "Linux, macOS")])
def test_the_default_signals_the_page_states_are_the_platforms(platform, row):
    (line,) = [line for line in page().splitlines() if line.startswith(f"| {row} | `[")]
    stated = re.findall(r"SIG\w+", line.split("|")[2])
    assert stated == list(default_preemption_signals(platform))
    assert default_preemption_signals("darwin") == default_preemption_signals("linux")


def test_the_refusal_the_page_quotes_is_the_one_a_run_gives():
    with pytest.raises(StopSignalError) as refused:
        stop_signal_name("SIGUSR2", "win32")
    text = " ".join(page().split())
    assert f"training.preemption_signals: {refused.value}" in text


def test_what_hydra_refuses_unquoted_it_takes_in_quotes():
    text = " ".join(page().split())
    found = re.search(r"`\\\\` is one backslash there, and (.+?) are refused", text)
    assert found, "the page no longer says what Hydra refuses without quotes"
    signs = re.findall(r"`([^`]+)`", found.group(1))
    assert signs and "an accent" in found.group(1)
    assert parsed([r"key=\\server\share"]) == {"key": "\\server\\share"}  # one backslash
    for sign in [*signs, "é"]:
        value = rf"C:\a{sign}b"
        with pytest.raises(OverrideParseException):
            parsed([f"key={value}"])
        assert parsed([f"key='{value}'"]) == {"key": value}


def test_the_speed_table_is_benchs_page_s():
    # The seed's rows, predicted by experiments/windows-gloo (whose tables
    # experiments/check_tables.py checks), as docs/bench.md states them.
    lines = page().splitlines()
    start = lines.index(next(line for line in lines if line.startswith("| config | per-GPU")))
    table = lines[start : start + 4]
    bench = (PAGE.parent / "bench.md").read_text(encoding="utf-8").splitlines()
    assert len(table) == 4 and all(line in bench for line in table), table
