"""``python -m benchmarks``: every op, every mode (see benchmarks/runner.py for the flags).

Also runs as ``python path/to/benchmarks`` from any folder (gpu_check.sh does that, so
that an installed fastrank is measured rather than the source tree next to it).
"""
if __package__ in (None, ""):  # run as a folder: make the `benchmarks` package importable
    import pathlib
    import sys
    _here = pathlib.Path(__file__).resolve()
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _here.parent]
    sys.path.append(str(_here.parents[1]))  # after site-packages: an installed fastrank wins

from benchmarks.runner import main

raise SystemExit(main())
