"""fastrank's benchmarks: ``python -m benchmarks`` (see benchmarks/README.md).

Layers, each importing only those above it in this list:

- cli_args.py: the rule of every command for a user's mistake (fastrank's, loaded by file);
- timing.py, memory.py: how long one call takes, how much memory it adds;
- ceilings.py: the device's measured rates, and an op's floor from them;
- baselines.py: the PyTorch versions raced against the kernels (compiled, chunked);
- ops.py: every op, described once (inputs, implementations, sizes, floor);
- harness.py: measuring implementations of an op over its sizes, one record each;
- results.py, case.py: a run's payload and files; what a case is;
- tables.py, plots.py, report.py: markdown and PNG from the JSON (results and README);
- cases/: one file per case (``--list``); cli.py, __main__.py: the command line.
"""
