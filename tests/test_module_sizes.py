"""Every module of the package reads at once: none is over 400 lines (split by concept)."""

from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
MOST_LINES = 400


def test_no_module_is_over_400_lines():
    sizes = {
        str(path.relative_to(SRC)): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(SRC.rglob("*.py"))
    }
    assert len(sizes) > 100  # the tree was found
    over = {path: lines for path, lines in sizes.items() if lines > MOST_LINES}
    assert not over, f"modules over {MOST_LINES} lines (split them by concept): {over}"
