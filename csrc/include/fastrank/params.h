// fastrank/params.h: the pieces every kernel's parameter struct is built from, and the
// codes and sizes the bindings export to Python (among them the smooth-rank engine's
// workspace, the `ws` of its three heads).
//
// Each native kernel (the forward and the backward of each op, per backend) takes one
// struct, declared in the op's header (smooth_ndcg.h, ...) from these pieces. The binder
// (csrc/bindings/fill.h) fills it from the Python values in field declaration order and
// passes it whole to the entry point; on CUDA
// the entry point passes it whole to its kernels (as flash-attention passes its
// Flash_fwd_params). A backend's struct holds what that backend reads, nothing more.
// Plain aggregates: trivially copyable, so a CUDA kernel can take them by value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

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

// ---- the smooth-rank engine's workspace ----------------------------------------------------
// Shared by its three heads (smooth_ndcg.h, smooth_ap.h, recall_at_k.h) on the CPU and on CUDA.
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

// ---- the field names of a parameter struct ------------------------------------------------
// FASTRANK_FIELDS(Struct, field, ...) after a struct's declaration names its fields, in
// declaration order, for the binder: it exports them (fields_of(Struct*), found by argument-
// dependent lookup) and the Python side of the op checks its own list of the fields it fills
// against them when it declares the kernel (src/fastrank/ops/_launch.py, kernel). The compiler
// checks the list against the declaration: every name a field (offsetof), in declaration order
// (increasing offsets), and as many as the struct has (field_count, compared by the binder with
// the struct's element count). FASTRANK_FIELDS_AFTER(Struct, Base, field, ...): a struct derived
// from Base, Base's fields first. Up to 16 names.
#define FASTRANK_FE_1(F, S, a) F(S, a)
#define FASTRANK_FE_2(F, S, a, ...) F(S, a) FASTRANK_FE_1(F, S, __VA_ARGS__)
#define FASTRANK_FE_3(F, S, a, ...) F(S, a) FASTRANK_FE_2(F, S, __VA_ARGS__)
#define FASTRANK_FE_4(F, S, a, ...) F(S, a) FASTRANK_FE_3(F, S, __VA_ARGS__)
#define FASTRANK_FE_5(F, S, a, ...) F(S, a) FASTRANK_FE_4(F, S, __VA_ARGS__)
#define FASTRANK_FE_6(F, S, a, ...) F(S, a) FASTRANK_FE_5(F, S, __VA_ARGS__)
#define FASTRANK_FE_7(F, S, a, ...) F(S, a) FASTRANK_FE_6(F, S, __VA_ARGS__)
#define FASTRANK_FE_8(F, S, a, ...) F(S, a) FASTRANK_FE_7(F, S, __VA_ARGS__)
#define FASTRANK_FE_9(F, S, a, ...) F(S, a) FASTRANK_FE_8(F, S, __VA_ARGS__)
#define FASTRANK_FE_10(F, S, a, ...) F(S, a) FASTRANK_FE_9(F, S, __VA_ARGS__)
#define FASTRANK_FE_11(F, S, a, ...) F(S, a) FASTRANK_FE_10(F, S, __VA_ARGS__)
#define FASTRANK_FE_12(F, S, a, ...) F(S, a) FASTRANK_FE_11(F, S, __VA_ARGS__)
#define FASTRANK_FE_13(F, S, a, ...) F(S, a) FASTRANK_FE_12(F, S, __VA_ARGS__)
#define FASTRANK_FE_14(F, S, a, ...) F(S, a) FASTRANK_FE_13(F, S, __VA_ARGS__)
#define FASTRANK_FE_15(F, S, a, ...) F(S, a) FASTRANK_FE_14(F, S, __VA_ARGS__)
#define FASTRANK_FE_16(F, S, a, ...) F(S, a) FASTRANK_FE_15(F, S, __VA_ARGS__)
#define FASTRANK_FE_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, NAME, ...) NAME
#define FASTRANK_FOR_EACH(F, S, ...)                                                                             \
  FASTRANK_FE_PICK(__VA_ARGS__, FASTRANK_FE_16, FASTRANK_FE_15, FASTRANK_FE_14, FASTRANK_FE_13, FASTRANK_FE_12, \
                   FASTRANK_FE_11, FASTRANK_FE_10, FASTRANK_FE_9, FASTRANK_FE_8, FASTRANK_FE_7, FASTRANK_FE_6,  \
                   FASTRANK_FE_5, FASTRANK_FE_4, FASTRANK_FE_3, FASTRANK_FE_2, FASTRANK_FE_1)                   \
  (F, S, __VA_ARGS__)
#define FASTRANK_OFFSET_OF(S, a) offsetof(S, a),
#define FASTRANK_PLUS_ONE(S, a) +1

// The names of a comma-separated list ("a, b, c" -> {"a", "b", "c"}), after `before`.
inline std::vector<std::string> field_names(std::vector<std::string> before, const char* list) {
  std::string name;
  for (const char* c = list;; ++c) {
    if (*c == ',' || *c == '\0') {
      before.push_back(name);
      name.clear();
      if (*c == '\0') return before;
    } else if (*c != ' ') {
      name += *c;
    }
  }
}
constexpr bool increasing(std::initializer_list<size_t> offsets) {
  size_t at = 0;
  bool first = true;
  for (size_t o : offsets) {
    if (!first && o <= at) return false;
    at = o;
    first = false;
  }
  return true;
}

// offsetof of a struct derived from another (RecallAtKForward: SmoothApForward's fields, then its
// own) is "conditionally-supported" in C++17 (not standard-layout); GCC, Clang and nvcc support
// it for a base without virtual functions or virtual bases, as all of ours are, and GCC warns
// (-Winvalid-offsetof) regardless: silenced for the field check alone.
#if defined(__GNUC__)
#define FASTRANK_GCC_OFFSETOF_BEGIN \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Winvalid-offsetof\"")
#define FASTRANK_GCC_OFFSETOF_END _Pragma("GCC diagnostic pop")
#else
#define FASTRANK_GCC_OFFSETOF_BEGIN
#define FASTRANK_GCC_OFFSETOF_END
#endif
#if defined(__CUDACC__) && !defined(FASTRANK_SIMT)  // nvcc's front end: its number for the same warning
#define FASTRANK_OFFSETOF_DERIVED_BEGIN _Pragma("nv_diag_suppress 1427") FASTRANK_GCC_OFFSETOF_BEGIN
#define FASTRANK_OFFSETOF_DERIVED_END FASTRANK_GCC_OFFSETOF_END _Pragma("nv_diag_default 1427")
#else
#define FASTRANK_OFFSETOF_DERIVED_BEGIN FASTRANK_GCC_OFFSETOF_BEGIN
#define FASTRANK_OFFSETOF_DERIVED_END FASTRANK_GCC_OFFSETOF_END
#endif
#define FASTRANK_FIELDS_CHECKED(S, base_names, base_count, ...)                                              \
  inline std::vector<std::string> fields_of(const S*) { return ::fastrank::field_names(base_names, #__VA_ARGS__); } \
  constexpr int field_count(const S*) { return base_count FASTRANK_FOR_EACH(FASTRANK_PLUS_ONE, S, __VA_ARGS__); }    \
  FASTRANK_OFFSETOF_DERIVED_BEGIN                                                                             \
  static_assert(::fastrank::increasing({FASTRANK_FOR_EACH(FASTRANK_OFFSET_OF, S, __VA_ARGS__)}),                  \
                #S "'s FASTRANK_FIELDS are not its fields in declaration order");                                \
  FASTRANK_OFFSETOF_DERIVED_END
#define FASTRANK_FIELDS(S, ...) FASTRANK_FIELDS_CHECKED(S, {}, 0, __VA_ARGS__)
#define FASTRANK_FIELDS_AFTER(S, Base, ...) \
  FASTRANK_FIELDS_CHECKED(S, fields_of(static_cast<const Base*>(nullptr)), 1, __VA_ARGS__)

namespace cuda {
// The CUDA struct of an entry point that reads what the backend-neutral struct P holds:
// P's fields, then the stream (a cudaStream_t, the last field everywhere: Python's
// _launch.call appends it). `using KendallForward = OnStream<::fastrank::KendallForward>;`
template <class P> struct OnStream : P {
  void* stream;
};
template <class P> std::vector<std::string> fields_of(const OnStream<P>*) {
  std::vector<std::string> names = fields_of(static_cast<const P*>(nullptr));
  names.push_back("stream");
  return names;
}
template <class P> constexpr int field_count(const OnStream<P>*) { return 2; }  // P, then the stream
}  // namespace cuda

}  // namespace fastrank
