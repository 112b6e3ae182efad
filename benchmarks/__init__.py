"""fastrank's benchmark harness: ``python -m benchmarks`` (see benchmarks/README.md).

One file per idea: harness.py (one case: guard, warm-up, repeats, record), memory.py
(peak extra memory), floors.py (device ceilings and each op's floors), baselines.py (the
PyTorch baselines: eager reference, torch.compile, chunked), report.py (JSON, markdown,
plots), runner.py (the command line), bench_<op>.py (what each op's cases are).
"""
