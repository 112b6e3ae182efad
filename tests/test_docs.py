"""Every Python block of README.md and docs/**/*.md runs, so a doc that drifts from the API
fails here instead of in a user's hands.

The blocks of one file run top to bottom in one namespace, as a reader pasting them into
one Python session would, each file in a fresh temporary directory (the embedding cache
too: ``FASTRANK_CACHE_DIR``). A failing block fails its test with a traceback that points
at the Markdown file's own line. One test per block, named ``<file>:<line>``; selecting a
later block alone runs the blocks before it first.

Skipping is visible, in the block itself (so a reader sees it too) and in the test report
(pytest's ``-ra`` prints each reason). A block whose first lines are

    # docs test: skip: <reason>          never run here (trains on your data, needs your
                                         trainer's objects, downloads, ...)
    # docs test: needs <what>[, <what>]  run only where each <what> is available: ``cuda``
                                         (a CUDA device) or an importable module name
                                         (``open_clip``, ``allrank``); skipped otherwise

is reported as skipped with that reason. Any other ``# docs test:`` line, or a skip without
a reason, fails the test: a typo never skips a block silently. Blocks fenced as
``python`` or ``py`` run; ``bash`` and other blocks are not Python and are left alone.

The docs' one list of the losses, the README's ``## Losses`` table (docs_losses.py; the site
makes the losses' index and nav from it), is held here to the table of ops
(src/fastrank/ops/registry.py) and to the pages of docs/losses/, without building the site.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import re
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
PYTHON_INFOS = ("python", "py", "python3")
DIRECTIVE = re.compile(r"^#\s*docs test:\s*(.*?)\s*$")


@dataclass
class Block:
    path: pathlib.Path
    line: int                       # 1-based line of the first code line in the file
    code: str
    skip: Optional[str] = None      # a stated reason never to run it
    needs: List[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse_directives(code: str, where: str) -> Tuple[Optional[str], List[str]]:
    """(skip reason, needs) from the block's leading comment lines."""
    skip, needs = None, []
    for raw in code.splitlines():
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("#"):
            break
        m = DIRECTIVE.match(line)
        if m is None:
            continue
        body = m.group(1)
        if body.startswith("skip"):
            reason = body[len("skip"):].lstrip(" :")
            if not reason or not body[len("skip"):].lstrip().startswith(":"):
                raise ValueError(f"{where}: '# docs test: skip' needs a reason: '# docs test: skip: <reason>'")
            skip = reason
        elif body.startswith("needs "):
            names = [n for n in re.split(r"[,\s]+", body[len("needs "):]) if n]
            if not names or not all(re.fullmatch(r"[A-Za-z_][\w.]*", n) for n in names):
                raise ValueError(f"{where}: '# docs test: needs' takes 'cuda' or module names, got {body!r}")
            needs.extend(names)
        else:
            raise ValueError(f"{where}: unknown directive {line!r}; use '# docs test: skip: <reason>' or "
                             f"'# docs test: needs <cuda | module>'")
    return skip, needs


def extract_blocks(path: pathlib.Path, text: Optional[str] = None) -> List[Block]:
    """The fenced Python blocks of a Markdown file (``` or ~~~ fences, indented ones too)."""
    lines = (path.read_text() if text is None else text).splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).lower()
        start = i + 1
        j = start
        while j < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise ValueError(f"{path.name}:{i + 1}: unclosed code fence")
        if info in PYTHON_INFOS:
            body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[start:j]]
            code = textwrap.dedent("\n".join(body)) + "\n"
            where = f"{path.name}:{start + 1}"
            skip, needs = parse_directives(code, where)
            blocks.append(Block(path, start + 1, code, skip, needs))
        i = j + 1
    return blocks


def missing(needs: List[str]) -> Optional[str]:
    """Why a block's needs are not met here, or None."""
    for what in needs:
        if what == "cuda":
            if not torch.cuda.is_available():
                return "needs cuda (no CUDA device here)"
            continue
        try:
            importlib.import_module(what)
        except Exception as e:  # noqa: BLE001  (a broken install is as missing as none)
            return f"needs {what} ({type(e).__name__}: {e})"
    return None


# ------------------------------------------------------------------ running a file's blocks
ALL_BLOCKS = [b for path in DOC_FILES for b in extract_blocks(path)]


@dataclass
class FileRun:
    namespace: dict
    workdir: pathlib.Path
    done: int = 0                       # blocks of the file handled so far
    failed: Optional[str] = None        # name of the block that failed


_RUNS: Dict[pathlib.Path, FileRun] = {}


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    return tmp_path_factory


def _execute(block: Block, run: FileRun) -> None:
    env = {"FASTRANK_CACHE_DIR": str(run.workdir / "embedding-cache"), "MPLBACKEND": "Agg"}
    saved_env = {k: os.environ.get(k) for k in env}
    cwd = os.getcwd()
    os.environ.update(env)
    os.chdir(run.workdir)
    try:
        # line numbers of the traceback are the Markdown file's own
        code = compile("\n" * (block.line - 1) + block.code, str(block.path), "exec")
        exec(code, run.namespace)
    finally:
        os.chdir(cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _skip_reason(block: Block) -> Optional[str]:
    if block.skip is not None:
        return block.skip
    return missing(block.needs)


def _run_until(block: Block, workdirs) -> None:
    """Run the blocks of block's file up to and including it (each once)."""
    blocks = [b for b in ALL_BLOCKS if b.path == block.path]
    index = blocks.index(block)
    run = _RUNS.get(block.path)
    if run is None:
        torch.manual_seed(0)
        run = _RUNS[block.path] = FileRun({"__name__": "__docs__"},
                                          workdirs.mktemp(block.path.stem.replace(".", "_")))
    while run.done <= index:
        current = blocks[run.done]
        run.done += 1
        if run.failed is not None:
            if current is block:
                pytest.skip(f"{block.name}: not run, the earlier block {run.failed} failed")
            continue
        reason = _skip_reason(current)
        if reason is not None:
            if current is block:
                pytest.skip(f"{block.name}: {reason}")
            continue
        try:
            _execute(current, run)
        except BaseException:
            run.failed = current.name
            if current is block:
                raise
            pytest.skip(f"{block.name}: not run, the earlier block {current.name} failed")


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.name for b in ALL_BLOCKS])
def test_doc_block_runs(block, workdirs):
    _run_until(block, workdirs)


# ------------------------------------------------------------------ the harness itself
def test_every_doc_file_is_collected():
    names = {p.relative_to(ROOT).as_posix() for p in DOC_FILES}
    assert "README.md" in names and "docs/porting.md" in names
    assert "docs/losses/smooth-ndcg.md" in names     # the pages of docs/'s subfolders too
    for path in DOC_FILES:
        text = path.read_text()
        fenced = len(re.findall(r"^\s*```\s*(?:python|py)\s*$", text, flags=re.M))
        assert len([b for b in ALL_BLOCKS if b.path == path]) == fenced, path
    # the README's example, and a runnable example on every loss page
    assert sum(b.path.name == "README.md" for b in ALL_BLOCKS) >= 1
    for page in sorted((ROOT / "docs" / "losses").glob("*.md")):
        assert any(b.path == page and b.skip is None for b in ALL_BLOCKS), page
    # at most a minority of blocks may be skipped for good (the rest must really run)
    never = [b for b in ALL_BLOCKS if b.skip is not None]
    assert len(never) * 3 < len(ALL_BLOCKS), [b.name for b in never]


SAMPLE = """\
# Title

```bash
make test
```

```python
x = 1
```

- a list item with code:

  ```python
  # docs test: needs cuda, open_clip
  y = x + 1
  ```

~~~py
# docs test: skip: trains a model for an hour
raise SystemExit
~~~
"""


def test_extract_blocks_and_directives(tmp_path):
    blocks = extract_blocks(tmp_path / "x.md", SAMPLE)
    assert [(b.line, b.code, b.skip, b.needs) for b in blocks] == [
        (8, "x = 1\n", None, []),
        (14, "# docs test: needs cuda, open_clip\ny = x + 1\n", None, ["cuda", "open_clip"]),
        (19, "# docs test: skip: trains a model for an hour\nraise SystemExit\n", "trains a model for an hour", []),
    ]
    assert missing(["math"]) is None
    assert missing(["no_such_module_for_fastrank_docs"]).startswith("needs no_such_module_for_fastrank_docs (")


@pytest.mark.parametrize("code,match", [
    ("# docs test: skip\nx = 1\n", "needs a reason"),
    ("# docs test: skip:   \nx = 1\n", "needs a reason"),
    ("# docs test: skipp: typo\nx = 1\n", "needs a reason"),
    ("# docs test: ignore\nx = 1\n", "unknown directive"),
    ("# docs test: needs cuda!\nx = 1\n", "takes 'cuda' or module names"),
])
def test_bad_directives_are_errors(code, match):
    with pytest.raises(ValueError, match=match):
        parse_directives(code, "x.md:1")


def test_failing_block_reports_the_markdown_line(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n\n```python\na = 1\nb = a / 0\n```\n")
    (block,) = extract_blocks(doc)
    run = FileRun({}, tmp_path)
    with pytest.raises(ZeroDivisionError) as info:
        _execute(block, run)
    frames = [f for f in info.traceback if str(f.path) == str(doc)]
    assert frames and frames[-1].lineno + 1 == 5      # pytest's lineno is 0-based


# ------------------------------------------------------------------ the one list of the losses
def _losses_table():
    """The README's Losses table, read by docs_losses.py at the checkout's root (as the site's hooks read it)."""
    spec = importlib.util.spec_from_file_location("docs_losses", ROOT / "docs_losses.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module.read(ROOT / "README.md")


def _loss_rows():
    from fastrank.ops.registry import LOSSES
    return list(LOSSES.values())


def test_readme_losses_table_lists_every_loss_and_page():
    table = _losses_table()
    rows = {name: row for row in table.rows for name in row.functions}
    functions = [loss.functional.__name__ for loss in _loss_rows()]
    modules = [loss.module.__name__ for loss in _loss_rows() if loss.module is not None]
    for loss in _loss_rows():
        name = loss.functional.__name__
        assert name in rows, f"README.md, '## Losses': no row links `{name}` to its page docs/losses/<op>.md"
        assert (ROOT / rows[name].page).is_file(), f"README.md, '## Losses': `{name}` links {rows[name].page}: no such page"
        if loss.module is not None:
            assert loss.module.__name__ in rows[name].modules, \
                f"README.md, '## Losses': the row of `{name}` does not name its module `{loss.module.__name__}`"
    assert sorted(rows) == sorted(functions), "README.md, '## Losses': functions that fastrank.ops.registry lacks"
    listed = [m for row in table.rows for m in row.modules]
    assert sorted(listed) == sorted(modules), "README.md, '## Losses': modules that fastrank.ops.registry lacks"
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "losses").glob("*.md")} - {"docs/losses/index.md"}
    assert sorted(pages - set(table.pages)) == [], "pages of docs/losses/ that no row of the README's table links"
    assert sorted(set(table.pages) - pages) == [], "the README's table links loss pages that do not exist"


def _api_section(page: pathlib.Path) -> Dict[str, Optional[str]]:
    """The ``::: <object>`` blocks of the page's ``## API`` section: object path -> its ``heading`` option."""
    lines = page.read_text().splitlines()
    assert "## API" in lines, f"{page.relative_to(ROOT)}: no '## API' section"
    blocks, current = {}, None
    for line in lines[lines.index("## API") + 1:]:
        if line.startswith("#"):
            break
        m = re.match(r"^:::\s*(\S+)", line)
        if m:
            current = m.group(1)
            blocks[current] = None
        m = re.match(r"^\s+heading:\s*(\S+)\s*$", line)
        if m and current is not None:
            blocks[current] = m.group(1)
    return blocks


def test_every_loss_page_documents_its_api():
    """Each loss page ends with the API of its functions and modules, from the module that
    defines each (static analysis finds them there), headed by the public name."""
    table = _losses_table()
    page_of = {name: row.page for row in table.rows for name in row.functions}
    expected: Dict[str, Dict[str, str]] = {page: {} for page in table.pages}
    for loss in _loss_rows():
        page = page_of.get(loss.functional.__name__)
        if page is None:
            continue                 # test_readme_losses_table_lists_every_loss_and_page says which
        forms = [(loss.functional, "fastrank.")] + ([(loss.module, "fastrank.nn.")] if loss.module else [])
        for obj, public in forms:
            expected[page][f"{obj.__module__}.{obj.__qualname__}"] = public + obj.__name__
    for page, blocks in expected.items():
        assert _api_section(ROOT / page) == blocks, f"{page}: its '## API' section (object: heading)"
