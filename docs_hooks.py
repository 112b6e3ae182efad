"""MkDocs hooks of the docs site (mkdocs.yml: ``hooks: [docs_hooks.py]``).

The Markdown is written to be read on GitHub as well as on the site, so it links to files
of the repository outside ``docs/`` (``../benchmarks/results/x.json``, ``../tests/simt/``)
and the README links into ``docs/``. Two hooks make that one text serve both:

- the README is the site's home page (``index.md``), its ``docs/...`` links made relative
  to ``docs/``;
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

log = logging.getLogger("mkdocs.hooks.docs_hooks")

LINK = re.compile(r"(?P<text>!?\[(?:[^\[\]]|\[[^\]]*\])*\])\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
README_HOME = "index.md"


def _root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def on_files(files, config):
    """The README as the home page, its links into docs/ made relative to docs/."""
    readme = _root(config) / "README.md"
    text = readme.read_text(encoding="utf-8")
    text = LINK.sub(lambda m: _readme_link(m), text)
    files.append(File.generated(config, README_HOME, content=text))
    return files


def _readme_link(m: re.Match) -> str:
    target = m.group("target")
    if target.startswith("docs/"):
        target = target[len("docs/"):]
    elif not re.match(r"^[a-z]+:|^#|^/", target):
        target = "../" + target            # a repository file, seen from docs/
    return f"{m.group('text')}({target}{m.group('title') or ''})"


def on_page_markdown(markdown, page, config, files):
    """Relative links that leave docs/ point at the repository (or become text)."""
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
