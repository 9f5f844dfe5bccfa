"""The README and the pages under docs/ point only at what the repository holds.

Every relative link of README.md, docs/**/*.md and experiments/*/README.md must name a
file of the repository (GitHub shows the pages as they are, so a link works there or
nowhere), and a link's ``#anchor`` into a Markdown file must be one of that file's
headings, slugged as GitHub and MkDocs slug them. No page may point outside the
repository (``../shared``, the design notes beside it). Code blocks and inline code are not links.

``mkdocs build --strict`` (in .ci/run) checks the links between pages too; this test
also covers the README and the links from the pages to ``experiments/``, which the site
leaves out, and runs in the test suite.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted(
    [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *REPO.glob("experiments/*/README.md")]
)

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)
OUTSIDE = ("../shared", "DESIGN.md")
"""What no page may name: the notes beside the repository."""


def prose(text: str) -> str:
    """``text`` without its code blocks and inline code."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a Markdown text's headings (a repeated heading gets ``-1``, ...)."""
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        base = anchor = slug(heading)
        n = 0
        while anchor in found:
            n += 1
            anchor = f"{base}-{n}"
        found.add(anchor)
    return found


def link_problems(document: Path, text: str) -> list[str]:
    """Each relative link of ``text`` (the content of ``document``) that leads nowhere."""
    problems = []
    name = document.relative_to(REPO).as_posix()
    for target in LINK.findall(prose(text)):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path_part, _, anchor = target.partition("#")
        path = (document.parent / path_part).resolve() if path_part else document
        if not path.is_relative_to(REPO):
            problems.append(f"{name}: {target} points outside the repository")
        elif not path.exists():
            problems.append(f"{name}: {target}: no such file")
        elif anchor and path.suffix == ".md":
            page = text if path == document else path.read_text(encoding="utf-8")
            if anchor not in anchors(page):
                problems.append(f"{name}: {target}: no heading with that anchor")
    return problems


def outside_mentions(document: Path, text: str) -> list[str]:
    """Each line of ``text`` that names something outside the repository."""
    name = document.relative_to(REPO).as_posix()
    return [
        f"{name}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if any(word in line for word in OUTSIDE)
    ]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_leads_to_a_file_and_heading(document):
    assert link_problems(document, document.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_page_names_what_lies_outside_the_repository(document):
    assert outside_mentions(document, document.read_text(encoding="utf-8")) == []


def test_no_code_or_config_names_what_lies_outside_the_repository():
    # Code, tests, configs and scripts cite the design by docs/architecture.md's
    # headings, not by a file that users and contributors do not have.
    files = [
        path
        for folder in ("src", "tests", "experiments", ".ci")
        for path in (REPO / folder).rglob("*")
        if path.suffix in {".py", ".yaml", ".sh", ".toml", ""} and path.is_file()
    ]
    files += [REPO / "pyproject.toml", REPO / "mkdocs.yml"]
    found = [
        mention
        for path in files
        if path != Path(__file__)
        for mention in outside_mentions(path, path.read_text(encoding="utf-8", errors="ignore"))
    ]
    assert len(files) > 100 and found == []


def test_the_documents_were_found():
    names = {p.relative_to(REPO).as_posix() for p in DOCUMENTS}
    assert {"README.md", "docs/index.md", "docs/configuration.md"} <= names


def test_the_slugs_are_githubs():
    assert slug("Will more GPUs help? (`bench.py`)") == "will-more-gpus-help-benchpy"
    assert slug("Where a run's time goes") == "where-a-runs-time-goes"
    assert (
        slug("Fine-tuning a pretrained encoder (`training.encoder_lr_factor`, `x`)")
        == "fine-tuning-a-pretrained-encoder-trainingencoder_lr_factor-x"
    )


BROKEN = {
    "a missing file": ("](own-data.md)", "](own_data.md)", "own_data.md: no such file"),
    "a missing anchor": (
        "](own-data.md#your-classes)",
        "](own-data.md#your-class)",
        "own-data.md#your-class: no heading with that anchor",
    ),
    "a link out of the repository": (
        "](own-data.md)",
        "](../../shared/notes.md)",
        "points outside the repository",
    ),
}


@pytest.mark.parametrize("edit", list(BROKEN))
def test_a_broken_link_is_caught(edit):
    old, new, problem = BROKEN[edit]
    document = REPO / "docs" / "getting-started.md"
    text = document.read_text(encoding="utf-8")
    assert old in text
    problems = link_problems(document, text.replace(old, new, 1))
    assert any(problem in p for p in problems), problems


def test_a_mention_of_the_design_notes_is_caught():
    document = REPO / "docs" / "index.md"
    text = document.read_text(encoding="utf-8") + "\nSee ../shared/DESIGN.md section 2.\n"
    assert outside_mentions(document, text) != []
