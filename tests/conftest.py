"""Test-session setup shared by every test file."""
import os

import fastrank

# The CUDA test matrix runs on a GPU, or emulated on the CPU in a child process started by
# tests/test_emulated.py (FASTRANK_SIMT_MODULE set there); otherwise it is not collected.
if not (os.environ.get("FASTRANK_SIMT_MODULE") or fastrank.backends()["cuda_available"]):
    collect_ignore = ["cuda_matrix"]
