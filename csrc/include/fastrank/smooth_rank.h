// The smooth-rank engine's workspace, shared by its three heads (smooth_ndcg.h,
// smooth_ap.h, recall_at_k.h) on the CPU and on CUDA.
//
// Every head ranks, for each query of each requested direction (i2t: the n rows; t2i: the
// m columns, read through swapped strides), its list's *row* items j by the smooth rank
//   R(j) = 1 + sum_{k in the list, k != j} sigma((s_k - s_j) / tau)
// and turns the ranks into the query's loss. One forward call computes every requested
// direction and the reduction; the backward is elementwise over what the forward saved:
//   ws = [w_i2t (n*m) if i2t][w_t2i (n*m) if t2i][aux (Q)][qloss (Q)][count_i2t, count_t2i]
// w_d: per-element state of direction d in the (n, m) layout (0 for masked items), the
// query's gradient row G (up to the head's per-query factor) or, for smooth-NDCG on CUDA,
// the coefficients of its backward pair pass (version 1 of its kernels; version 2 keeps G like
// the subset heads); for Smooth-AP, Recall@k and smooth-NDCG version 2 on CUDA, w_t2i is
// stored transposed, (m, n), each column query's G contiguous; aux: a per-query value of the head (the IDCG
// for smooth-NDCG); qloss: the per-query losses, i2t first; count_d: the queries of
// direction d that count in "mean" (as float). Q = the number of queries (n if i2t, + m if
// t2i). Elements are of the accumulation type (float, double for float64).
#pragma once
#include <cstdint>

#include "fastrank/common.h"

namespace fastrank {

struct SmoothRankLayout {
  bool d1, d2;                        // i2t, t2i requested
  int64_t nq1, nq2, q;                // queries per direction, Q
  int64_t a1, a2, idcg, qloss, counts;  // offsets of w_i2t, w_t2i, aux, qloss, counts
};

FR_HD SmoothRankLayout smooth_rank_layout(int64_t n, int64_t m, int direction) {
  SmoothRankLayout l;
  l.d1 = (direction & kI2T) != 0;
  l.d2 = (direction & kT2I) != 0;
  l.nq1 = l.d1 ? n : 0;
  l.nq2 = l.d2 ? m : 0;
  l.q = l.nq1 + l.nq2;
  l.a1 = 0;
  l.a2 = l.d1 ? n * m : 0;
  l.idcg = (int64_t(l.d1) + int64_t(l.d2)) * n * m;
  l.qloss = l.idcg + l.q;
  l.counts = l.qloss + l.q;
  return l;
}

inline int64_t smooth_rank_ws_numel(int64_t n, int64_t m, int direction) {
  return smooth_rank_layout(n, m, direction).counts + 2;
}

// CUDA, the subset heads (Smooth-AP, Recall@k): the forward's scratch (smooth_rank.cuh).
// Four (n, m) arrays per direction (the positives' ranks and coefficients), then, when t2i
// is requested, the column lists transposed, so that a column query reads its list
// contiguously: sim^T (m, n) in sim's element type (within n * m accumulation-type
// elements), then positives^T and mask^T, (m, n) bytes each (counted in 4-byte elements,
// the smallest accumulation type).
FR_HD int64_t smooth_rank_transposed_offset(int64_t n, int64_t m, int direction) {
  return 4 * (int64_t((direction & kI2T) != 0) + int64_t((direction & kT2I) != 0)) * n * m;
}

inline int64_t smooth_rank_partials_numel(int64_t n, int64_t m, int direction) {
  const int64_t nm = n * m;
  return smooth_rank_transposed_offset(n, m, direction) + ((direction & kT2I) ? nm + (2 * nm + 3) / 4 : 0);
}

}  // namespace fastrank
