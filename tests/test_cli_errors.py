"""Every command refuses a user's mistake in one line and writes nothing (src/fastrank/_cli_args.py).

For every option of every command, read from the parsers themselves, ``BAD`` holds a bad
value for it (a wrong type, a value out of range, an unknown name, a missing path), or the
arguments that give it one where it needs more (a case, a positional): the command exits with status 2 before any work, prints exactly one line
``<command>: error: ...`` on stderr that names the option, no traceback, and creates or changes
no file (the output folder is a temporary one, the working directory too, and the repository's
benchmarks/results is watched). An option without a row fails ``test_every_option_has_a_row``:
a new option gets its row here, one line. Flags that take no value are listed as ``FLAG``.

The commands run in this process (``main(argv)``); a few rows also run as the real commands
(``python -m fastrank``, the ``fastrank`` console script, ``python -m benchmarks``).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastrank  # noqa: F401  (before the benchmarks: the fastrank in use is the one they measure)

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import cli as bench_cli  # noqa: E402
from benchmarks import profile_call, report  # noqa: E402
from benchmarks.cuda import resources as cuda_resources  # noqa: E402
from fastrank import cli as fastrank_cli  # noqa: E402

FLAG = "no bad value possible (a flag without a value)"
# past its parser, python -m benchmarks imports the cases: a fastrank with its native module
needs_native = pytest.mark.skipif(not fastrank.backends()["cpu"] and os.environ.get("FASTRANK_REQUIRE_NATIVE") != "1",
                                  reason="native CPU module not built (FASTRANK_REQUIRE_NATIVE=1: a failure)")

# option -> its bad value (the row runs `option value`), or the whole list of arguments.
# Placeholders: {missing} a path that does not exist, {file} an existing file where a folder is
# wanted, {dir} an existing folder where a file is wanted.
BAD = {
    "fastrank info": {},
    "fastrank check": {
        "--device": "gpu",
        "--ops": "smooth_ndcg,bogus",
    },
    "fastrank train": {
        "--config": "{missing}",
        "--set": "nokey",
        "--data": "/nonexistent",
        "--train-split": "a/b",
        "--eval-split": "../test",
        "--out": "{file}",
        "--loss": "bogus:1",
        "--image-encoder": "bogus",
        "--text-encoder": "bogus",
        "--embed-dim": "0",
        "--relevance": "bogus",
        "--relevance-topk": "-1",
        "--epochs": "-1",
        "--batch-size": "1",
        "--lr": "abc",
        "--seed": "-1",
        "--device": "gpu",
        "--workers": "-1",
        "--cache-chunk": "-1",
        "--memory-size": "x",
        "--rerank": FLAG,
        "--resume": "{missing}",
        "--no-progress": FLAG,
    },
    "fastrank eval": {
        "--checkpoint": "{missing}",
        "--data": "{missing}",
        "--split": "a/b",
        "--relevance": "bogus",
        "--rerank": FLAG,
        "--no-graded": FLAG,
        "--device": "cuda:x",
        "--json": "{dir}",
    },
    "fastrank demo": {
        "--out": "{file}",
        "--quick": FLAG,
        "--device": "bogus",
        "--epochs": "1",
        "--seed": "-1",
        "--recipes": "triplet,bogus",
        "--threads": "-2",
        "--no-progress": FLAG,
    },
    "fastrank extract": {
        "--data": "{missing}",
        "--images": "{missing}",
        "--backbone": "{missing}",
        "--out": "{file}",
        "--split": "train,bogus",
        "--name": ".hidden",
        "--features": "bogus",
        "--captions-per-image": "0",
        "--batch-size": "0",
        "--chunk-size": "-5",
        "--device": "bogus",
        "--dtype": "float64",
        "--workers": "-1",
        "--max-chunks": "-1",
        "--no-progress": FLAG,
    },
    "python -m benchmarks": {
        "CASE": ["bogus"],
        "--list": FLAG,
        "--quick": FLAG,
        "--device": "bogus",
        "--dtype": "float8",
        "--threads": "0",
        "--out": "{file}",
        "--tag": "a/b",
        "--force": FLAG,
        "--time-limit": "-1",
        "--ops": ["sweep", "--ops", "bogus"],
        "--impls": ["percall", "--impls", "native,bogus"],
        "--max-n": "0",
        "--min-n": "x",
        "--no-plots": FLAG,
        "--modes": ["sweep", "--modes", "sideways"],
        "--order": "bogus",
        "--huge": FLAG,
        "--case-limit": "0",
        "--repeat-budget": "-1",
        "--min-repeats": "0",
        "--max-repeats": "1.5",
        "--mem-fraction": "1.5",
        "--mem-budget-gb": "0",
        "--no-floors": FLAG,
        "--directions": "i2t,sideways",
        "--topk": "0",
        "--samples": "0",
        "--sample-time": "0",
        "--case-time": "inf",
        "--before": "{missing}",
        "--sweep-sizes": FLAG,
        "--n-images": "0",
        "--chunk": "0",
        "--towers": ["scale", "--towers", "minilm"],
        "--sizes": "256,0",
        "--full": FLAG,
        "--splits": ["quality", "--splits", "0"],
        "--steps": "0",
        "--lengths": "3,1",
        "--workers": "0",
        "--resume": FLAG,
        "--kernel-src": "{missing}",
    },
    "python -m benchmarks report": {
        "paths": ["{missing}"],
        "--check": FLAG,
        "--no-plots": FLAG,
    },
    "python -m benchmarks cuda_resources": {
        "--write": FLAG,
        "--check": FLAG,
        "--rev": "no-such-revision",
        "--jobs": "0",
    },
    "python benchmarks/profile_call.py": {
        "op": ["bogus", "8"],
        "n": ["smooth_ndcg", "0"],
        "--direction": "bogus",
        "--dtype": "int8",
        "--device": "bogus",
    },
}


def _fastrank_sub(name):
    def sub():
        [action] = [a for a in fastrank_cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
        return action.choices[name]
    return sub


# command -> (its parser, main(argv), the arguments every row starts with: the output folder)
COMMANDS = {
    **{f"fastrank {name}": (_fastrank_sub(name), lambda argv, name=name: fastrank_cli.main([name, *argv]),
                           ["--out", "{out}"] if name in ("train", "demo", "extract") else [])
       for name in ("info", "check", "train", "eval", "demo", "extract")},
    "python -m benchmarks": (lambda: bench_cli.parser(()), bench_cli.main, ["--out", "{out}"]),
    "python -m benchmarks report": (report.parser, lambda argv: bench_cli.main(["report", *argv]), []),
    "python -m benchmarks cuda_resources": (cuda_resources.parser,
                                            lambda argv: bench_cli.main(["cuda_resources", *argv]), []),
    "python benchmarks/profile_call.py": (profile_call.parser, profile_call.main, []),
}


# what each command needs besides options (its required arguments), for the unknown-option rows
REQUIRED = {"fastrank eval": ["--checkpoint", "{file}"],
            "fastrank extract": ["--data", "{file}", "--backbone", "some/model", "--out", "{out}"],
            "python -m benchmarks report": ["{dir}"],
            "python benchmarks/profile_call.py": ["smooth_ndcg", "8"]}


def _name(action) -> str:
    """How a row names an option: its long option string, or a positional's metavar / dest."""
    if action.option_strings:
        return max(action.option_strings, key=len)
    return action.metavar or action.dest


def options(parser):
    return {_name(a): a for a in parser._actions if not isinstance(a, argparse._HelpAction)}


def test_the_table_covers_every_command():
    assert set(BAD) == set(COMMANDS)
    subs = [a for a in fastrank_cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert {f"fastrank {n}" for n in subs[0].choices} <= set(COMMANDS), "a fastrank subcommand without rows"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_has_a_row(command):
    opts = options(COMMANDS[command][0]())
    rows = BAD[command]
    missing = sorted(set(opts) - set(rows))
    assert not missing, (f"{command}: option(s) {missing} have no bad-input row in BAD "
                         f"(tests/test_cli_errors.py): add one line each, or FLAG for a flag without a value")
    stale = sorted(set(rows) - set(opts))
    assert not stale, f"{command}: BAD has rows for {stale}, which the parser does not have"
    for name, row in rows.items():   # FLAG only where no value is taken
        assert (row == FLAG) == (opts[name].nargs == 0), f"{command} {name}: FLAG iff the option takes no value"


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))} if folder.exists() else {}


def _started(what):
    def work(*args, **kwargs):
        raise AssertionError(f"the command started work ({what}) instead of refusing the value")
    return work


class _NoOps(dict):
    """profile_call's table of ops, listing them (the choices of its parser) but refusing to give one."""

    def __getitem__(self, key):
        return _started("profile_call's op")()


@pytest.fixture
def place(tmp_path, monkeypatch):
    """The placeholders of a row, in a working directory of their own; where each command
    would start its work, an AssertionError (a value that got through fails fast)."""
    import fastrank.check
    import fastrank.extract
    import fastrank.train.demo
    import fastrank.train.evaluation
    import fastrank.train.loop
    for owner, attr in ((bench_cli, "run_case"), (bench_cli, "run_each"), (fastrank.train.loop, "Trainer"),
                        (fastrank.check, "run"),
                        (fastrank.train.demo, "run_demo"), (fastrank.extract, "run_extraction"),
                        (fastrank.train.evaluation, "evaluate_split"), (cuda_resources, "collect"),
                        (report, "render_result"), (report, "render_markdown")):
        monkeypatch.setattr(owner, attr, _started(f"{owner.__name__}.{attr}"))
    monkeypatch.setattr(profile_call, "OPS", _NoOps(profile_call.OPS))
    work = tmp_path / "work"
    work.mkdir()
    (work / "a_file.txt").write_text("not a folder\n")
    (work / "a_folder").mkdir()
    monkeypatch.chdir(work)
    return work, {"out": str(work / "out"), "missing": str(work / "missing" / "nothing"),
                  "file": str(work / "a_file.txt"), "dir": str(work / "a_folder")}


def run_in_process(main, argv):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(prog, code, stdout, stderr, names):
    """Exit status 2 and one stderr line ``<prog>: error: ...`` naming one of ``names``."""
    assert code == 2, (prog, code, stdout[-2000:], stderr[-3000:])
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert any(n in lines[0] for n in names), (names, lines[0])


ROWS = [pytest.param(c, o, id=f"{c}:{o}", marks=[needs_native] if c == "python -m benchmarks" and isinstance(row, list)
                     else []) for c, rows in BAD.items() for o, row in rows.items() if row != FLAG]


@pytest.mark.parametrize("command,option", ROWS)
def test_a_bad_value_is_one_line_exit_2_and_writes_nothing(command, option, place):
    work, fill = place
    parser, main, base = COMMANDS[command]
    names = options(parser())[option].option_strings or [option]
    row = BAD[command][option]
    argv = [a.format(**fill) for a in base + ([option, row] if isinstance(row, str) else row)]
    results = _tree(bench_cli.RESULTS)
    before = _tree(work)
    code, stdout, stderr = run_in_process(main, argv)
    assert_one_line_error(command, code, stdout, stderr, names)
    assert _tree(work) == before, "the command wrote a file"
    assert _tree(bench_cli.RESULTS) == results, "the command changed benchmarks/results"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unknown_option_is_one_line_exit_2(command, place):
    work, fill = place
    _, main, _ = COMMANDS[command]
    before = _tree(work)
    code, stdout, stderr = run_in_process(main, [a.format(**fill) for a in REQUIRED.get(command, [])]
                                          + ["--no-such-option"])
    # a subcommand's unknown option is the top parser's to refuse: "fastrank: error: ..."
    prog = "fastrank" if command.startswith("fastrank ") else command
    assert_one_line_error(prog, code, stdout, stderr, ["--no-such-option"])
    assert _tree(work) == before


# ---------------------------------------------------------------- the real commands

def _run(args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(fastrank.__file__).parents[1]), str(ROOT)])}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("argv", [
    ["-m", "fastrank", "train", "--data", "demo", "--loss", "bogus:1"],
    pytest.param(["-m", "benchmarks", "scale", "--towers", "minilm"], marks=needs_native),
    ["-m", "benchmarks", "quality", "--splits", "0"],
], ids=["fastrank-loss", "benchmarks-towers", "benchmarks-splits"])
def test_the_commands_say_it_the_same_way(argv, tmp_path):
    """As typed by a new user (the benchmarks with their default output folder, the repository's
    benchmarks/results): one line, exit 2, nothing written."""
    fastrank_cmd = argv[1] == "fastrank"
    results = _tree(bench_cli.RESULTS)
    proc = _run([sys.executable, *argv], tmp_path if fastrank_cmd else ROOT)
    prog = "fastrank train" if fastrank_cmd else "python -m benchmarks"
    assert_one_line_error(prog, proc.returncode, proc.stdout, proc.stderr, [argv[-2]])
    assert _tree(tmp_path) == {} and _tree(bench_cli.RESULTS) == results


def test_the_console_script_says_it_the_same_way(tmp_path):
    script = Path(sys.executable).with_name("fastrank")
    if not script.is_file():
        pytest.skip("no fastrank console script beside this Python")
    proc = _run([str(script), "train", "--data", "demo", "--epochs", "-1", "--out", str(tmp_path / "out")], tmp_path)
    assert_one_line_error("fastrank train", proc.returncode, proc.stdout, proc.stderr, ["--epochs"])
    assert proc.stderr.strip() == "fastrank train: error: argument --epochs: train.epochs must be an integer >= 1, got -1"
    assert not (tmp_path / "out").exists()
