"""The docs' one list of fastrank's losses: the table under the README's ``## Losses`` heading.

A row of the table documents one public function, or a few that share a page: its first
cell links the function(s) (code spans, with their signatures) to the page
``docs/losses/<op>.md``, its second names the module form(s) in ``fastrank.nn``; the other
cells are prose (what it is for, the paper, the implementation). Everything else of the docs
that lists the losses is made from it: docs_hooks.py puts the table on docs/losses/index.md
and the pages, in the order the table first links them, in the Losses section of the site's
nav; tests/test_docs.py holds it equal to the table of ops (src/fastrank/ops/registry.py)
and to the pages of docs/losses/.

Standard library only, so the tests read the table without mkdocs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple

HEADING = "## Losses"
PAGES = "docs/losses/"                 # the loss pages, relative to the repository's root
PAGE_LINK = re.compile(r"\[(?P<text>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<page>docs/losses/[\w.-]+\.md)\)")
FUNCTION = re.compile(r"`([A-Za-z_]\w*)(?:\(|`)")     # `name(...)` or `name`, not `"soft"`
MODULE = re.compile(r"`([A-Za-z_]\w*)`")
CELL_BORDER = re.compile(r"(?<!\\)\|")                 # GFM: an unescaped pipe, even in a code span


@dataclass(frozen=True)
class Row:
    """One row: the public functions its first cell links to its page, and their module forms."""
    functions: Tuple[str, ...]       # fastrank.<name>
    modules: Tuple[str, ...]         # fastrank.nn.<Name>; empty where the function has none
    page: str                        # docs/losses/<op>.md


@dataclass(frozen=True)
class LossesTable:
    markdown: str                    # the table's lines as the README has them (links from the root)
    rows: Tuple[Row, ...]

    @property
    def pages(self) -> Tuple[str, ...]:
        """The loss pages in the order the table first links them (the nav's order)."""
        return tuple(dict.fromkeys(row.page for row in self.rows))


def read(readme: Path) -> LossesTable:
    """The Losses table of the README file ``readme``."""
    return parse(readme.read_text(encoding="utf-8"))


def parse(text: str) -> LossesTable:
    """The Losses table of the README's text: the first table under ``## Losses``.

    Raises ValueError where there is none, or where a row does not link exactly one loss
    page from its first cell.
    """
    lines = text.splitlines()
    try:
        start = lines.index(HEADING)
    except ValueError:
        raise ValueError(f"README: no {HEADING!r} section") from None
    table = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    if len(table) < 3:
        raise ValueError(f"README: no table with rows under {HEADING!r}")
    rows = []
    for line in table[2:]:                           # past the header and the delimiter row
        cells = [c.strip() for c in CELL_BORDER.split(line.strip().strip("|"))]
        links = list(PAGE_LINK.finditer(cells[0]))
        pages = {m.group("page") for m in links}
        if len(pages) != 1:
            raise ValueError(f"README, {HEADING!r}: a row's first cell must link one page of {PAGES}, "
                             f"got {sorted(pages)}: {line}")
        functions = tuple(name for m in links for name in FUNCTION.findall(m.group("text")))
        modules = tuple(MODULE.findall(cells[1])) if len(cells) > 1 else ()
        rows.append(Row(functions, modules, pages.pop()))
    return LossesTable("\n".join(table), tuple(rows))
