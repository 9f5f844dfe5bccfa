"""MkDocs hook: links from a page to repository files outside ``docs/``, as text.

A page links to ``../experiments/<name>/README.md`` so that the link works where the
pages are read as files (GitHub, an editor). The site holds only ``docs/``, so there
such a link would be broken: it is written as the file's path in the repository
instead. A link to a file that does not exist is left alone, for the strict build to
report.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

LINK = re.compile(r"\[([^\]]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")
"""A Markdown inline link: its text, its path, its anchor."""


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The page's Markdown with links to files outside ``docs/`` written as their paths."""
    docs = Path(config["docs_dir"]).resolve()
    repository = docs.parent
    here = (docs / page.file.src_uri).parent

    def as_text(link: re.Match[str]) -> str:
        text, target = link[1], link[2]
        if "://" in target or target.startswith(("/", "mailto:")):
            return link[0]
        path = (here / target).resolve()
        if path.is_relative_to(docs) or not path.is_relative_to(repository):
            return link[0]
        if not path.exists():
            return link[0]
        return f"{text} (`{path.relative_to(repository).as_posix()}` in the repository)"

    return LINK.sub(as_text, markdown)
