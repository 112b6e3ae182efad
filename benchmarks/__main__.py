"""``python -m benchmarks`` (cli.py). Also runs as ``python path/to/benchmarks`` from any
folder (gpu_check.sh and ``make bench`` do that, so that an installed fastrank is measured
rather than the source tree next to it)."""
import sys

if __package__ in (None, ""):  # run as a folder: make the `benchmarks` package importable
    import pathlib
    _here = pathlib.Path(__file__).resolve()
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _here.parent]
    sys.path.append(str(_here.parents[1]))  # after site-packages: an installed fastrank wins
    launcher = [sys.executable, str(_here.parent)]
else:
    launcher = [sys.executable, "-m", "benchmarks"]

from benchmarks.cli import main  # noqa: E402

raise SystemExit(main(launcher=launcher))
