// fastrank/params.h: the pieces every kernel's parameter struct is built from, and the
// codes and sizes the bindings export to Python.
//
// Each native kernel (the forward and the backward of each op, per backend) takes one
// struct, declared in the op's header (smooth_ndcg.h, ...) from these pieces. The binder
// (csrc/bindings/fill.h) fills it from the Python values in field declaration order and
// passes it whole to the entry point; on CUDA
// the entry point passes it whole to its kernels (as flash-attention passes its
// Flash_fwd_params). A backend's struct holds what that backend reads, nothing more.
// Plain aggregates: trivially copyable, so a CUDA kernel can take them by value.
#pragma once

#include <cstdint>

#include "fastrank/common.h"

namespace fastrank {

// A strided matrix: element (i, j) is data[i * s0 + j * s1], strides in elements. The t2i
// direction reads the same matrix through swapped strides, never a transposed copy.
template <typename P> struct Strided {
  P* data;
  int64_t s0, s1;
};
using MatIn = Strided<const void>;      // scores or labels in a DType of the struct
using MaskIn = Strided<const uint8_t>;  // a bool matrix read as bytes; data null = every item valid

// Relevance given as lists (docs/spec.md §2.1b, fastrank.TopKRelevance), a sparse matrix by
// queries: query q's entries are positions offsets[q] .. offsets[q + 1] - 1 of index (the
// candidate; one outside [0, candidates) is no entry) and value (its relevance, in the
// relevance dtype of the struct). Every candidate not listed has relevance 0. offsets null:
// not given (the relevance is a matrix).
struct ListsIn {
  const int64_t* offsets;
  const int64_t* index;
  const void* value;
};

// A strided vector (the upstream gradient of per-query losses: stride 0 for a broadcast one).
struct VecIn {
  const void* data;
  int64_t s;
};

// The list arguments of a fused loss call: the storage dtype of sim, the (n, m) shape (the
// i2t queries are the n rows, the t2i queries the m columns), the directions and the
// reduction (codes: common.h, Direction and Reduction).
struct Lists {
  DType dt;
  int64_t n, m;
  int direction, reduction;
};

// The number of per-query losses of a direction code: n if i2t, + m if t2i.
FR_HD int64_t query_count(int64_t n, int64_t m, int direction) {
  return ((direction & kI2T) ? n : 0) + ((direction & kT2I) ? m : 0);
}

namespace cuda {
// The CUDA struct of an entry point that reads what the backend-neutral struct P holds:
// P's fields, then the stream (a cudaStream_t, the last field everywhere: Python's
// _launch.call appends it). `using KendallForward = OnStream<::fastrank::KendallForward>;`
template <class P> struct OnStream : P {
  void* stream;
};
}  // namespace cuda

}  // namespace fastrank
