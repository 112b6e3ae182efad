"""The quality study: does graded ranking train better models, and at which list length?

A model-training study, not a timing: the bundled MiniLM fine-tuned on real human graded
judgments with fastrank's and sentence-transformers' losses under identical conditions, scored
on held-out items with ``fastrank.metrics`` and scipy's rank correlations.

- ``judgments``: the Lee and SimLex-999 judgments (gensim's test data) and their disjoint halves;
- ``search``: the hyper-parameter search on the train half alone;
- ``study``: the jobs (train, predict, score) and the run, ``python -m benchmarks quality``;
- ``report``: its tables (a row per loss, win / tie / lose per list length) and plot.

It runs through the benchmarks harness (its job runner and result files), as its ``quality``
case; its results live beside the others in ``benchmarks/results/``.
"""
