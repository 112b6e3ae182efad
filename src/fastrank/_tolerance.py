"""How close a native op must come to the pure-PyTorch reference: the one rule of the CUDA test
matrix (tests/_cuda_matrix.py) and of ``fastrank check`` (src/fastrank/check.py).

Both compare against the reference run in float64 on the same input, rounded to the dtype
the native op was given:

- float32 and float64: every value and gradient within ``atol + rtol * |reference|``
  (:data:`TOLERANCE`);
- float16 and bfloat16: the native op's largest error at most twice the largest error of the
  reference itself run in that dtype (:func:`low_precision_bound`): rounding the input and
  the gradient to half precision costs what it costs, the kernel may not add more than as
  much again.
"""
from __future__ import annotations

import torch

#: elementwise ``|native - reference| <= atol + rtol * |reference|``, by the native op's dtype
TOLERANCE = {torch.float64: dict(rtol=1e-9, atol=1e-11), torch.float32: dict(rtol=3e-5, atol=3e-6)}

#: half precision: the native op's error may be this many times the low-precision reference's
LOW_PRECISION_FACTOR = 2.0


def low_precision_bound(reference_error: float) -> float:
    """The largest error allowed a native op in half precision, from ``reference_error``, the
    largest error of the reference run in the same dtype (both against the float64 reference)."""
    return LOW_PRECISION_FACTOR * reference_error + 1e-12
