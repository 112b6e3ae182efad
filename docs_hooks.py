"""MkDocs hooks of the docs site (mkdocs.yml: ``hooks: [docs_hooks.py]``).

The Markdown is written to be read on GitHub as well as on the site, so it links to files
of the repository outside ``docs/`` (``../benchmarks/results/x.json``, ``../tests/simt/``)
and the README links into ``docs/``. The hooks make that one text serve both:

- the README is the site's home page (``index.md``), its ``docs/...`` links made relative
  to ``docs/``;
- the README's ``## Losses`` table is the one list of the losses (docs_losses.py): it
  replaces the part of docs/losses/index.md between ``<!-- losses table: ... -->`` and
  ``<!-- end losses table -->`` (on GitHub, a link to the README's table), and its pages, in
  the order it first links them, follow losses/index.md in the nav's Losses section. A page
  of docs/losses/ that the table does not link, or a link of the table to no page, is a
  warning;
- a relative link to a file of the repository outside ``docs/`` becomes a link to that file
  at ``repo_url`` (``<repo_url>/blob/<branch>/<path>``, the branch from ``extra.repo_branch``,
  default ``main``), or plain text when no ``repo_url`` is set. A link to a path that does
  not exist is reported as a warning, so ``mkdocs build --strict`` fails on it just as it
  does on a broken link between pages.
"""
from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

import docs_losses

log = logging.getLogger("mkdocs.hooks.docs_hooks")

LINK = re.compile(r"(?P<text>!?\[(?:[^\[\]]|\[[^\]]*\])*\])\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
README_HOME = "index.md"
LOSSES_INDEX = "losses/index.md"
LOSSES_SECTION = "Losses"
LOSSES_TABLE = re.compile(r"^<!-- losses table:.*?-->$.*?^<!-- end losses table -->$", re.M | re.S)


def _root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def _losses_table(config) -> docs_losses.LossesTable:
    return docs_losses.read(_root(config) / "README.md")


def on_config(config):
    """The loss pages, in the order of the README's Losses table, after losses/index.md in the nav."""
    docs = Path(config.docs_dir).resolve()
    linked = [posixpath.relpath(page, "docs") for page in _losses_table(config).pages]
    for page in linked:
        if not (docs / page).is_file():
            log.warning("README.md, %r: links docs/%s, which does not exist", docs_losses.HEADING, page)
    for path in sorted((docs / posixpath.dirname(LOSSES_INDEX)).glob("*.md")):
        page = path.relative_to(docs).as_posix()
        if page != LOSSES_INDEX and page not in linked:
            log.warning("docs/%s: no row of the README's %r table links it", page, docs_losses.HEADING)
    sections = [entry for entry in config.nav or () if isinstance(entry, dict) and LOSSES_SECTION in entry]
    if len(sections) != 1 or not isinstance(sections[0][LOSSES_SECTION], list):
        log.warning("mkdocs.yml: the nav needs one section %r (a list) for the loss pages", LOSSES_SECTION)
        return config
    section = sections[0][LOSSES_SECTION]
    section.extend(page for page in linked if page not in section and (docs / page).is_file())
    return config


def on_files(files, config):
    """The README as the home page, its links into docs/ made relative to docs/."""
    readme = _root(config) / "README.md"
    text = _from_root(readme.read_text(encoding="utf-8"), "")
    files.append(File.generated(config, README_HOME, content=text))
    return files


def _from_root(markdown: str, page_dir: str) -> str:
    """The relative links of Markdown written at the repository's root (the README) made
    relative to the folder ``page_dir`` of docs/ (``""``: docs/ itself)."""
    def fix(m: re.Match) -> str:
        target = m.group("target")
        if re.match(r"^[a-z]+:|^#|^/", target):
            return m.group(0)
        path, hash_, anchor = target.partition("#")
        path = posixpath.relpath(path, posixpath.join("docs", page_dir))
        return f"{m.group('text')}({path}{hash_}{anchor}{m.group('title') or ''})"

    return LINK.sub(fix, markdown)


def on_page_markdown(markdown, page, config, files):
    """The README's Losses table on losses/index.md; relative links that leave docs/ point at
    the repository (or become text)."""
    if page.file.src_uri == LOSSES_INDEX:
        table = _from_root(_losses_table(config).markdown, posixpath.dirname(LOSSES_INDEX))
        markdown, found = LOSSES_TABLE.subn(lambda m: table, markdown)
        if found != 1:
            log.warning("docs/%s: needs one '<!-- losses table: ... -->' ... '<!-- end losses table -->' "
                        "part for the README's Losses table", LOSSES_INDEX)
    root = _root(config)
    docs = Path(config.docs_dir).resolve()
    page_dir = posixpath.dirname(page.file.src_uri)
    repo_url = (config.repo_url or "").rstrip("/")
    branch = (config.extra or {}).get("repo_branch", "main")

    def fix(m: re.Match) -> str:
        target = m.group("target")
        if re.match(r"^[a-z]+:|^#|^/", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        resolved = (docs / page_dir / path).resolve()
        try:
            resolved.relative_to(docs)
            return m.group(0)              # a page or file of the site: mkdocs checks it
        except ValueError:
            pass
        try:
            rel = resolved.relative_to(root).as_posix()
        except ValueError:
            log.warning("%s: link %r leaves the repository", page.file.src_uri, target)
            return m.group(0)
        if rel == "README.md":             # the README is the home page
            home = posixpath.relpath(README_HOME, page_dir or ".")
            return f"{m.group('text')}({home}{'#' + anchor if anchor else ''}{m.group('title') or ''})"
        if not resolved.exists():
            log.warning("%s: link %r: no such file in the repository (%s)", page.file.src_uri, target, rel)
            return m.group(0)
        text = m.group("text")
        if text.startswith("!"):
            log.warning("%s: image %r is outside docs/: move it into docs/", page.file.src_uri, target)
            return m.group(0)
        if not repo_url:
            return text[1:-1]
        kind = "tree" if resolved.is_dir() else "blob"
        url = f"{repo_url}/{kind}/{branch}/{rel}" + (f"#{anchor}" if anchor else "")
        return f"{text}({url}{m.group('title') or ''})"

    out, fenced = [], None
    for line in markdown.split("\n"):
        f = FENCE.match(line)
        if fenced is None and f:
            fenced = f.group(1)
        elif fenced is not None and f and f.group(1) == fenced:
            fenced = None
        elif fenced is None:
            line = LINK.sub(fix, line)
        out.append(line)
    return "\n".join(out)
