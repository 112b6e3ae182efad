"""The CUDA toolchain's checks, run without a GPU: what the real compiler makes of the kernels.

- ``resources``: every kernel's registers, spills and occupancy from ptxas, each pair loop's
  SASS instructions and MUFU operations against its budget (``python -m benchmarks
  cuda_resources [--check | --write]``, docs/cuda-resources.md);
- ``sass``: the SASS instruction counts of a loop, from nvdisasm;
- ``issue_model``: the issue-time model that turns those counts into a predicted GPU time,
  fitted on the measured GPU points (benchmarks/NOTES.md).
"""
