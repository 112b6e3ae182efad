// The subset heads on the CPU (Smooth-AP, Recall@k; docs/spec.md §2.8, 2.9): their query
// loop over the smooth-rank engine's subset pass (smooth_rank.h), the rows of a query's
// list being its positives. A head is its loss over the positives' ranks (smooth_ap.cpp,
// recall_at_k.cpp); everything else of a head's forward is here; its backward is the
// engine's elementwise one (smooth_ap.cpp, smooth_rank_backward).
#pragma once

#include <algorithm>
#include <cstring>
#include <limits>

#include "fastrank/smooth_ap.h"
#include "smooth_rank.h"

namespace fastrank {
namespace cpu {
namespace rank {
namespace {  // internal linkage, as smooth_rank.h's

// One query of a subset head over its gathered list (s, f: nv valid items, padded here to
// padded(nv)): the rows are the positives (f != 0). Returns the query's loss; with_grad:
// g[k] = d loss / d s_k for its items (+ poison(s_k): a non-finite score poisons its own
// entry; the loss gets the sum). *counted = whether it has a positive ("mean" counts it).
// Head: kFlagged (needs B_r, the ranks among the positives) and loss(np, A, B, u, v) -> the
// loss, writing u_r = d loss / d A_r and v_r = d loss / d B_r.
template <class Head, typename T>
T subset_list(const Head& head, T* __restrict s, T* __restrict f, int64_t nv, T inv_tau, SubsetScratch<T>& w,
              bool with_grad, T* __restrict g, int64_t* counted) {
  constexpr bool kFlagged = Head::kFlagged;
  T pois = 0;
#pragma omp simd reduction(+ : pois)
  for (int64_t k = 0; k < nv; ++k) pois += poison(s[k]);
  int64_t np = 0;
  for (int64_t k = 0; k < nv; ++k) {
    w.rows[np] = k;
    np += f[k] != T(0);
  }
  *counted = np > 0;
  const int64_t pad = padded(nv);
  std::fill(s + nv, s + pad, -std::numeric_limits<T>::infinity());  // padding lanes add exactly 0
  std::fill(f + nv, f + pad, T(0));
  T loss = 0;
  if (np > 0) {
    T* d = with_grad && np * pad * int64_t(sizeof(T)) <= kSigmaCacheBytes
               ? (w.d.size() < size_t(np * pad) ? (w.d.resize(np * pad), w.d.data()) : w.d.data())
               : nullptr;
    subset_ranks<kFlagged>(s, f, nv, w.rows.data(), np, inv_tau, w.A.data(), w.B.data(), w.S1.data(), w.S2.data(), d);
    loss = head.loss(np, w.A.data(), w.B.data(), w.u.data(), w.v.data());
    if (with_grad)
      subset_grad<kFlagged>(s, f, nv, w.rows.data(), np, inv_tau, w.u.data(), w.v.data(), w.S1.data(),
                            w.S2.data(), d, g);
  } else if (with_grad) {
    std::fill(g, g + pad, T(0));
  }
  if (with_grad) {
#pragma omp simd
    for (int64_t k = 0; k < nv; ++k) g[k] = g[k] * inv_tau + poison(s[k]);
  }
  return loss + pois;
}

// One query of a subset head, through any strides and masks: gathers its list, computes it
// (subset_list), writes its row of G (0 for masked items).
template <class Head, typename T>
T subset_query(const Head& head, const View& v, int64_t q, const T* sim, const uint8_t* pos, const uint8_t* mask,
               T inv_tau, SubsetScratch<T>& w, bool with_grad, T* G, int64_t* counted) {
  const uint8_t* mrow = mask ? mask + q * v.mq : nullptr;
  const int64_t nv = gather_valid(sim + q * v.sq, v.sc, pos + q * v.rq, v.rc, mrow, v.mc, v.nc, w.s.data(),
                                  w.f.data(), w.idx.data());
  const T loss = subset_list(head, w.s.data(), w.f.data(), nv, inv_tau, w, with_grad, w.g.data(), counted);
  if (with_grad) {
    T* grow = G + q * v.aq;
    if (mrow != nullptr) {
      for (int64_t c = 0; c < v.nc; ++c) grow[c * v.ac] = T(0);  // masked items: gradient 0
      for (int64_t k = 0; k < nv; ++k) grow[w.idx[k] * v.ac] = w.g[k];
    } else {
      for (int64_t k = 0; k < nv; ++k) grow[k * v.ac] = w.g[k];
    }
  }
  return loss;
}

// One column query (t2i) of a row-major matrix without a mask: the kTile columns of its tile
// are gathered together when the first of them comes (the query loop hands a thread whole
// tiles, in order), and their gradient rows written together after the last.
template <class Head, typename T>
T subset_column_query(const Head& head, const View& v, int64_t q, const T* sim, const uint8_t* pos, T inv_tau,
                      SubsetScratch<T>& w, bool with_grad, T* G, int64_t* counted) {
  const int64_t nc = v.nc, q0 = q / kTile * kTile, t = q - q0, nt = std::min(kTile, v.nq - q0);
  if (t == 0) {
    w.tile_s.resize(kTile * nc);
    w.tile_p.resize(kTile * nc);
    if (with_grad) w.tile_g.resize(kTile * nc);
    gather_rows(sim, v.sq, v.sc, q0, nt, nc, w.tile_s.data());
    gather_rows(pos, v.rq, v.rc, q0, nt, nc, w.tile_p.data());
  }
  T* s = w.s.data();
  T* f = w.f.data();
  std::memcpy(s, w.tile_s.data() + t * nc, sizeof(T) * static_cast<size_t>(nc));
  const uint8_t* prow = w.tile_p.data() + t * nc;
  for (int64_t c = 0; c < nc; ++c) f[c] = prow[c] != 0 ? T(1) : T(0);
  const T loss = subset_list(head, s, f, nc, inv_tau, w, with_grad, w.g.data(), counted);
  if (with_grad) {
    std::memcpy(w.tile_g.data() + t * nc, w.g.data(), sizeof(T) * static_cast<size_t>(nc));
    if (t == nt - 1) {  // the tile's last query: its kTile gradient columns, a row segment per item
      for (int64_t c = 0; c < nc; ++c) {
        T* out = G + c * v.ac + q0 * v.aq;
        for (int64_t i = 0; i < nt; ++i) out[i * v.aq] = w.tile_g[i * nc + c];
      }
    }
  }
  return loss;
}

// The whole forward of a subset head (Smooth-AP, Recall@k): every query of the requested
// directions (t2i through swapped strides), the reduction, G into ws (smooth_rank.h).
template <typename T, class Head>
void subset_forward(const Head& head, const SmoothApForward& p) {
  const ForwardCall<T> c = forward_call<T>(p.lists, p.sim, p.pos, p.mask, p.tau, p.out, p.ws);
  const T* sim = static_cast<const T*>(p.sim.data);
  const uint8_t* pos = p.pos.data;
  const uint8_t* mask = p.mask.data;
  const bool with_grad = p.with_grad;
  for (int64_t q = 0; q < c.L.q; ++q) c.ws[c.L.idcg + q] = T(1);  // aux: unused by the subset heads
  // the pair work is |P| x C per query, bounded by C^2 (c.work) for the threading decision;
  // the column queries of a row-major matrix without a mask go in tiles of kTile
  const bool tiles = c.L.d2 && mask == nullptr && c.v[1].sc != 1 && c.v[1].sq == 1 && c.v[1].rq == 1;
  run_queries<T>(
      c.L, c.n, c.m, c.work, p.lists.reduction, c.out, c.ws, [&] { return SubsetScratch<T>(c.c_max); },
      [&](SubsetScratch<T>& w, int d, int64_t q, int64_t* counted) {
        if (d == 1 && tiles)
          return subset_column_query(head, c.v[d], q, sim, pos, c.inv_tau, w, with_grad, c.G[d], counted);
        return subset_query(head, c.v[d], q, sim, pos, mask, c.inv_tau, w, with_grad, c.G[d], counted);
      },
      tiles ? kTile : 1);
}

}  // namespace
}  // namespace rank
}  // namespace cpu
}  // namespace fastrank
