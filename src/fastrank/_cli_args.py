"""The rule of every command (``fastrank ...``, ``python -m benchmarks ...``) for a user's mistake.

A value out of range, an unknown name, a missing file or a configuration key of the wrong type
prints one line ``<command>: error: <what, which argument, what is allowed>`` to stderr and
exits with status 2, before any work starts; a bug still shows its traceback.

- :class:`Parser`: an ``argparse.ArgumentParser`` whose errors are that one line (argparse
  prints its usage line first; ``-h`` still shows it).
- The argument types (:func:`integer`, :func:`real`, :func:`csv`, :func:`existing_file`,
  :func:`device`, ...): each refuses what the value alone tells is wrong, and argparse puts the
  option's name in front of its message (``argument --epochs: must be an integer >= 1, got
  '-1'``).
- :func:`usage_errors`: the boundary after parsing, around the validation of a configuration
  or of the inputs (never around the work): :class:`UsageError` and the library's own
  ``ValueError`` / ``TypeError`` / ``FileNotFoundError`` become that line.
- :func:`command`: a command's ``main(argv)`` then returns 2, to a caller in the same process
  as to the shell.

Standard library only: benchmarks/cli.py loads this file from the checkout beside it without
importing fastrank, because which fastrank a benchmark run measures is chosen before that import.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import math
import re
import sys
from pathlib import Path
from typing import Callable, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple, Type, Union

EXIT_USAGE = 2
#: the library's exceptions for a bad configuration or input (docs/spec.md section 1)
INPUT_ERRORS: Tuple[Type[BaseException], ...] = (ValueError, TypeError, FileNotFoundError)

Choices = Union[Sequence[str], Callable[[], Sequence[str]]]


class UsageError(Exception):
    """A user's mistake found after parsing (a check across options, or of the data they
    name): :func:`usage_errors` says it in one line. Raised only by such checks, never by a bug."""


class UsageExit(SystemExit):
    """What :func:`fail` raises, after its line: exit status 2 (:func:`command` returns it)."""


def one_line(text) -> str:
    """``text`` on one line (newlines and runs of spaces as one space)."""
    return " ".join(str(text).split())


def fail(prog: str, message) -> NoReturn:
    """Print ``<prog>: error: <message>`` on one line to stderr and exit with status 2."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr, flush=True)
    raise UsageExit(EXIT_USAGE)


def command(main: Callable[..., int]) -> Callable[..., int]:
    """Decorates a command's ``main(argv) -> exit status``: a user's mistake (its one line
    printed) returns 2, as for a caller in the same process as for the shell."""
    @functools.wraps(main)
    def run(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except UsageExit as stop:
            return stop.code
    return run


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors one line (:func:`fail`); its subparsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, message)


@contextlib.contextmanager
def usage_errors(prog: str, errors: Tuple[Type[BaseException], ...] = INPUT_ERRORS,
                 explain: Optional[Callable[[str], str]] = None) -> Iterator[None]:
    """Inside: a :class:`UsageError` or one of ``errors`` becomes the one line of :func:`fail`
    (``explain`` may add to the message, e.g. the option that set a configuration key). Wrap
    only the validation of what the user gave, so that a bug's ValueError keeps its traceback."""
    try:
        yield
    except (UsageError, *errors) as err:
        message = one_line(err)
        fail(prog, explain(message) if explain is not None else message)


def naming(options: Dict[str, str]) -> Callable[[str], str]:
    """An ``explain`` for :func:`usage_errors`: the message, and the options that set the
    configuration keys it names (``{"train.epochs": "--epochs"}``)."""
    def explain(message: str) -> str:
        named = [option for key, option in options.items() if key in message]
        return message + (f" (set by {', '.join(named)})" if named else "")
    return explain


# ------------------------------------------------------------------ argument types

def _named(name: str, parse: Callable) -> Callable:
    parse.__name__ = name   # argparse names a type by it in its own messages
    return parse


def _bad(text: str, what: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"must be {what}, got {text!r}")


def _number(convert: Callable[[str], float], what: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise _bad(text, what) from None
        if not ok(value):
            raise _bad(text, what)
        return value
    return _named(what, parse)


def integer(minimum: Optional[int] = None, maximum: Optional[int] = None) -> Callable[[str], int]:
    """An int >= minimum and <= maximum (None: no bound)."""
    what = (f"an integer from {minimum} to {maximum}" if minimum is not None and maximum is not None else
            "an integer" + (f" >= {minimum}" if minimum is not None else "") +
            (f" <= {maximum}" if maximum is not None else ""))
    return _number(int, what, lambda v: (minimum is None or v >= minimum) and (maximum is None or v <= maximum))


def real(minimum: Optional[float] = None, maximum: Optional[float] = None, *,
         above: bool = False) -> Callable[[str], float]:
    """A finite float >= minimum (> minimum with ``above``) and <= maximum (None: no bound)."""
    if minimum is not None and maximum is not None:
        what = f"a number in {'(' if above else '['}{minimum:g}, {maximum:g}]"
    else:
        what = "a finite number" + (f" {'>' if above else '>='} {minimum:g}" if minimum is not None else "") + \
            (f" <= {maximum:g}" if maximum is not None else "")
    return _number(float, what, lambda v: math.isfinite(v) and (
        minimum is None or (v > minimum if above else v >= minimum)) and (maximum is None or v <= maximum))


positive_int = integer(1)
nonnegative_int = integer(0)
positive_float = real(0, above=True)
nonnegative_float = real(0)
fraction = real(0, 1, above=True)


def _allowed(choices: Choices) -> List[str]:
    return list(choices() if callable(choices) else choices)


def unknown(values: Sequence[str], choices: Choices) -> Optional[str]:
    """None when every value is among ``choices``, else the message that says which are not."""
    allowed = _allowed(choices)
    bad = [v for v in values if v not in allowed]
    if not bad:
        return None
    return f"unknown {', '.join(repr(v) for v in bad)}; choose from {', '.join(allowed)}"


def one_of(choices: Choices) -> Callable[[str], str]:
    """One name among ``choices`` (a sequence, or a function returning one: read when parsing)."""
    def parse(text: str) -> str:
        why = unknown([text], choices)
        if why:
            raise argparse.ArgumentTypeError(why)
        return text
    return _named("name", parse)


def csv(item: Callable[[str], object] = str, choices: Optional[Choices] = None) -> Callable[[str], list]:
    """Comma-separated values, at least one, each parsed by ``item`` (and among ``choices``)."""
    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise _bad(text, "one or more comma-separated values")
        values = [item(p) for p in parts]
        why = unknown(values, choices) if choices is not None else None
        if why:
            raise argparse.ArgumentTypeError(why)
        return values
    return _named("list", parse)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def name(text: str) -> str:
    """A part of a file name (a tag, a split): letters, digits, '.', '_', '+', '-'."""
    if not _NAME.fullmatch(text):
        raise _bad(text, "a name of letters, digits, '.', '_', '+' and '-' (part of a file name)")
    return text


_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def device(text: str) -> str:
    """auto, cpu, cuda or cuda:N (whether CUDA is there: :func:`check_cuda`, after torch loads)."""
    if not _DEVICE.fullmatch(text):
        raise _bad(text, "auto, cpu, cuda or cuda:N")
    return text


def check_cuda(value: str, option: str = "--device") -> None:
    """UsageError when ``value`` asks for CUDA and torch sees none."""
    import torch
    if value.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"{option} {value!r}: torch sees no CUDA device; use cpu or auto")


def _existing(exists: Callable[[Path], bool], what: str) -> Callable[[str], Path]:
    def parse(text: str) -> Path:
        path = Path(text)
        if not exists(path):
            raise argparse.ArgumentTypeError(f"no such {what}: {text!r}")
        return path
    return _named(what, parse)


existing_file = _existing(Path.is_file, "file")
existing_dir = _existing(Path.is_dir, "folder")
existing_path = _existing(Path.exists, "file or folder")


def out_dir(text: str) -> Path:
    """A folder to write into (made when missing): not an existing file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    return path


def out_file(text: str) -> Path:
    """A file to write: in an existing folder, not itself a folder."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder of {text!r} does not exist")
    return path
