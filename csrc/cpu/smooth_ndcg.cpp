// Fused smooth-NDCG on the CPU (docs/spec.md §2.1, 2.1a; Listwise ITR, Eq. 16-21).
//
// One call computes every requested direction and the reduction: the forward is one pass
// over the pairs of each query (smooth ranks), then O(C log C) per query for the DCG and
// the IDCG (a sort of the query's gains); the backward is one more pass over the pairs.
// Work: O(n * m^2 + m * n^2) per pass. Never an (n_q, n_c, n_c) tensor.
// Memory plan: per thread, O(C) scratch rows: the query's valid items gathered
// contiguous (whatever the strides; the t2i queries are columns read through the swapped
// strides), padded with finite zeros to whole vectors. With a mask the valid items are
// compacted first, so the pair loops run over the valid items only. Saved for the
// backward: a (n, m) per direction, idcg and counts (the `ws` of smooth_ndcg.h).
// Parallelism: OpenMP over the queries of a direction (one query per thread at a time,
// every sum in a fixed order: bit-identical results run to run); one thread below
// kParallelWork pairs. The backward's t2i queries add into the gradient the i2t queries
// wrote, after the barrier that ends the i2t loop.
// The pair loops visit each unordered pair (j, k > j) once: one exp gives
// sigma(x) for j and sigma(-x) = 1 - sigma(x) for k; `#pragma omp simd` vectorises them
// (the float exp of common.h is plain arithmetic). The pair passes, the query loop and the
// elementwise backward are the smooth-rank engine's (smooth_rank.h); this file is its
// smooth-NDCG head: gains, DCG, IDCG and the rank coefficients.
#include "fastrank/smooth_ndcg.h"

#include <memory>

#include "column_tile.h"
#include "relevance_lists.h"
#include "smooth_rank.h"

namespace fastrank {
namespace cpu {
namespace {

using namespace rank;  // the smooth-rank engine (smooth_rank.h): the all-items pair passes

// IDCG (Eq. 19-21, sorted gains): the gains of g[0 .. n) in descending order, position p
// discounted by disc[p] = 1 / log2(2 + p); NaN when a gain is NaN (it would break the order).
// g has room for padded(n) values and is overwritten. Short lists count, for each gain, the
// gains above it (gt) and equal to it (eq, itself included): its tie group holds positions
// gt .. gt + eq - 1, so each member adds g_j times the mean of their discounts (disc[gt]
// itself when eq = 1): O(C^2) compares in whole vectors, no index compare, ~4x faster than
// std::sort at C = 128 (where the sort took 1.1 ms of a 128 x 128 call). Long lists sort.
// Gains of 0 add 0 wherever they stand and never move a positive gain's position, so the
// sparse path passes its nonzero gains alone.
template <typename T>
T ideal_dcg(T* __restrict g, int64_t n, const T* disc) {
  int nan_gain = 0;
  for (int64_t j = 0; j < n; ++j) nan_gain |= g[j] != g[j];
  if (nan_gain) return std::numeric_limits<T>::quiet_NaN();
  if (n > kCountRanksMax) {
    std::sort(g, g + n, std::greater<T>());
    T ideal = 0;
    for (int64_t i = 0; i < n; ++i) ideal += g[i] * disc[i];
    return ideal;
  }
  // in double: a tie group's members each add g_j times the group's mean discount, so
  // float rounding would grow with the group's size (a list of equal gains: 500 adds)
  double sum = 0;
  const int64_t pad = padded(n);
  std::fill(g + n, g + pad, -std::numeric_limits<T>::infinity());  // above or equal to none
  for (int64_t j = 0; j < n; ++j) {
    const T gj = g[j];
    if (gj == T(0)) continue;  // adds 0 wherever it stands
    T gt = 0, eq = 0;          // exact counts (C <= kCountRanksMax << 2^24)
#pragma omp simd reduction(+ : gt, eq)
    for (int64_t k = 0; k < pad; ++k) {
      gt += g[k] > gj ? T(1) : T(0);
      eq += g[k] == gj ? T(1) : T(0);
    }
    const int64_t at = static_cast<int64_t>(gt), ties = static_cast<int64_t>(eq);
    if (ties == 1) {
      sum += double(gj) * double(disc[at]);
    } else {
      double dsum = 0;
      for (int64_t i = 0; i < ties; ++i) dsum += double(disc[at + i]);
      sum += double(gj) * (dsum / double(ties));
    }
  }
  return static_cast<T>(sum);
}

// A thread's scratch: the gathered list and the all-items pass (dense lists), the subset
// pass (sparse lists, made on first use), a relevance row built from lists, and the kColumnTile
// column queries of a tile (column_query).
template <typename T> struct NdcgScratch {
  int64_t c;  // the longest list of the call
  Scratch<T> all;
  std::unique_ptr<SubsetScratch<T>> sub;
  std::vector<T> rel_row;
  std::vector<T> tile_s, tile_r, tile_g;  // kColumnTile rows of scores, relevance, G
  NdcgScratch(int64_t c_max, bool lists) : c(c_max), all(c_max), rel_row(lists ? c_max : 0) {}
  SubsetScratch<T>& subset() {
    if (!sub) sub = std::make_unique<SubsetScratch<T>>(c);
    return *sub;
  }
};

// The dense path over the nv gathered items s, r (every pair once): returns the DCG (with the
// poison of every item), writes the gains to gs (for the IDCG) and, with_grad, G (up to the
// per-query factor) to g.
template <typename T>
T dense_list(T* __restrict s, const T* __restrict r, int64_t nv, T inv_tau, Scratch<T>& w, bool with_grad,
             T* __restrict gs, T* __restrict g) {
  T* __restrict p = w.p.data();
  T* __restrict av = w.a.data();
  std::fill(s + nv, s + padded(nv), T(0));
  T* d = with_grad ? w.sigma_cache(nv) : nullptr;  // sigma' cache (short lists)
  smooth_ranks(s, nv, inv_tau, p, d);
  // Eq. 17: DCG = sum_j g_j / log2(1 + pi_j); a_j = g_j * d/dpi [1 / log2(1 + pi)](pi_j).
  // z = poison(s_j + r_j) carries a non-finite input into the loss and the gradient.
  for (int64_t j = 0; j < nv; ++j) gs[j] = ndcg_gain(r[j]);  // libm exp2: the reference's gain
  T dcg = 0;
#pragma omp simd reduction(+ : dcg)
  for (int64_t j = 0; j < nv; ++j) {
    const T gj = gs[j];
    T f, fd;
    ndcg_discounts(p[j], log_ge1(T(1) + p[j]), &f, &fd);  // p_j >= 1: no cancellation in 1 + p_j
    const T z = poison(s[j] + r[j]);
    dcg += gj * f + z;
    av[j] = gj * fd + z;
  }
  if (with_grad) {
    // G_m = sum_{k != m} sigma'((s_k - s_m) / tau) (a_k - a_m) (+ poison(a_m): a lone item)
    std::fill(av + nv, av + padded(nv), T(0));
    rank_grad(s, d, av, nv, inv_tau, p);  // p is free now: it receives G
    for (int64_t j = 0; j < nv; ++j) g[j] = p[j] + poison(av[j]);
  }
  return dcg;
}

// The sparse path (docs/spec.md §2.1b): only the np items of nonzero gain need a rank (an item
// of gain 0 adds 0 to the DCG whatever its rank), each against every item: the smooth-rank
// engine's subset pass with those items as rows, their self pairs left out (kSelfOut). Its
// gradient is the same G: with u = a (0 for the other items), subset_grad gives
// sum_{k != m} sigma'(.) (a_k - a_m) for every item m.
// Returns the DCG (with the poison of every item), writes the nonzero gains to gs (for the
// IDCG, *n_gains of them) and, with_grad, G to g.
template <typename T>
T sparse_list(T* __restrict s, const T* __restrict r, int64_t nv, int64_t np, T inv_tau, SubsetScratch<T>& w,
              bool with_grad, T* __restrict gs, T* __restrict g) {
  int64_t* rows = w.rows.data();
  T* A = w.A.data();
  T* S1 = w.S1.data();
  T* u = w.u.data();
  T pois = 0;
#pragma omp simd reduction(+ : pois)
  for (int64_t k = 0; k < nv; ++k) pois += poison(s[k] + r[k]);
  int64_t at = 0;
  for (int64_t k = 0; k < nv; ++k) {
    rows[at] = k;
    at += r[k] != T(0);  // a NaN relevance counts: it poisons the IDCG
  }
  const int64_t pad = padded(nv);
  std::fill(s + nv, s + pad, -std::numeric_limits<T>::infinity());  // padding lanes add exactly 0
  T* d = nullptr;
  if (with_grad && np * pad * int64_t(sizeof(T)) <= kSigmaCacheBytes) {
    if (w.d.size() < size_t(np * pad)) w.d.resize(np * pad);
    d = w.d.data();
  }
  subset_ranks<false, true>(s, static_cast<const T*>(nullptr), nv, rows, np, inv_tau, A, static_cast<T*>(nullptr), S1,
                      static_cast<T*>(nullptr), d);
  double dcg = 0;  // in double: a scalar loop over up to C terms (the dense path's sum runs in lanes)
  for (int64_t i = 0; i < np; ++i) {  // Eq. 17 over the rows
    const T gi = ndcg_gain(r[rows[i]]);
    T f, fd;
    ndcg_discounts(A[i], log_ge1(T(1) + A[i]), &f, &fd);
    gs[i] = gi;
    dcg += double(gi * f);
    u[i] = gi * fd;
  }
  if (with_grad) {
    subset_grad<false, true>(s, static_cast<const T*>(nullptr), nv, rows, np, inv_tau, u, static_cast<const T*>(nullptr),
                       S1, static_cast<const T*>(nullptr), d, g);
    for (int64_t k = 0; k < nv; ++k) g[k] += poison(s[k] + r[k]);
    for (int64_t i = 0; i < np; ++i) g[rows[i]] += poison(u[i]);
  }
  return static_cast<T>(dcg) + pois;
}

// One list of the forward, gathered into w.all.s and w.all.y (nv > 0 items): returns its
// loss, writes its IDCG to *idcg and, with_grad, points *g at its items' G = d DCG / d s * tau
// (the gradient up to the per-query factor -w / (tau * IDCG) that the backward applies),
// computed while the list is in cache.
template <typename T>
T ndcg_list(int64_t nv, int paths, T inv_tau, const T* disc, NdcgScratch<T>& w, bool with_grad, T* idcg,
            const T** g_out) {
  T* __restrict s = w.all.s.data();
  T* __restrict r = w.all.y.data();
  T* __restrict gs = w.all.g.data();
  int64_t np = 0;
  for (int64_t j = 0; j < nv; ++j) np += r[j] != T(0);
  T* g = w.all.p.data();  // G of the list's items (the dense path writes it last, from p)
  T dcg;
  int64_t n_gains = nv;
  if (takes_sparse_pass(paths, np, nv)) {
    SubsetScratch<T>& sub = w.subset();
    g = sub.g.data();
    dcg = sparse_list(s, r, nv, np, inv_tau, sub, with_grad, gs, g);
    n_gains = np;
  } else {
    dcg = dense_list(s, r, nv, inv_tau, w.all, with_grad, gs, g);
  }
  const T ideal = ideal_dcg(gs, n_gains, disc);
  *idcg = ideal;
  *g_out = g;
  // Eq. 18, 20-21: loss = 1 - DCG / IDCG; 0 when IDCG <= 0 (still poisoned by a NaN)
  return (ideal > T(0) ? T(1) - dcg / ideal : T(0)) + poison(dcg);
}

// One query of the forward through any strides and masks: gathers its list, computes it
// (ndcg_list), writes its IDCG and, with_grad, its row of G (0 for masked items).
// *n_valid = the number of items in its list.
template <typename T>
T forward_query(const View& v, int64_t q, const T* sim, const T* rel, const ListsIn& lists, const uint8_t* mask,
                int paths, T inv_tau, const T* disc, NdcgScratch<T>& w, bool with_grad, T* G, T* idcg,
                int64_t* n_valid) {
  const uint8_t* mrow = mask ? mask + q * v.mq : nullptr;
  const RowView<T> rrow = relevance_row(lists, rel, v.rq, v.rc, q, v.nc, w.rel_row.data());
  const int64_t nv = gather_valid(sim + q * v.sq, v.sc, rrow.row, rrow.stride, mrow, v.mc, v.nc, w.all.s.data(),
                                  w.all.y.data(), w.all.idx.data());
  *n_valid = nv;
  T* grow = G + q * v.aq;
  if (with_grad && mrow != nullptr)
    for (int64_t c = 0; c < v.nc; ++c) grow[c * v.ac] = T(0);  // masked items: gradient 0
  if (nv == 0) {
    idcg[q] = T(0);
    return T(0);
  }
  const T* g = nullptr;
  const T loss = ndcg_list(nv, paths, inv_tau, disc, w, with_grad, idcg + q, &g);
  if (with_grad)
    for (int64_t j = 0; j < nv; ++j) grow[(mrow ? w.all.idx[j] : j) * v.ac] = g[j];
  return loss;
}

// One column query (t2i) of a row-major sim without a mask: the kColumnTile columns of its tile
// are gathered together when the first of them comes (the query loop hands a thread whole
// tiles, in order; gather_rows reads whole lines of the matrix where a column alone would read
// a line per value), and their rows of G written together after the last (a row segment per
// item). The relevance: the matrix's columns through the same tile (its column stride 1 too),
// or each column's list, contiguous anyway.
template <typename T>
T column_query(const View& v, int64_t q, const T* sim, const T* rel, const ListsIn& lists, int paths, T inv_tau,
               const T* disc, NdcgScratch<T>& w, bool with_grad, T* G, T* idcg, int64_t* n_valid) {
  const int64_t nc = v.nc, q0 = q / kColumnTile * kColumnTile, t = q - q0, nt = std::min(kColumnTile, v.nq - q0);
  const bool matrix = lists.offsets == nullptr;
  if (t == 0) {
    w.tile_s.resize(kColumnTile * nc);
    gather_rows(sim, v.sq, v.sc, q0, nt, nc, w.tile_s.data());
    if (matrix) {
      w.tile_r.resize(kColumnTile * nc);
      gather_rows(rel, v.rq, v.rc, q0, nt, nc, w.tile_r.data());
    }
    if (with_grad) w.tile_g.resize(kColumnTile * nc);
  }
  *n_valid = nc;
  std::memcpy(w.all.s.data(), w.tile_s.data() + t * nc, sizeof(T) * static_cast<size_t>(nc));
  const T* r = matrix ? w.tile_r.data() + t * nc : relevance_row(lists, rel, 0, 1, q, nc, w.rel_row.data()).row;
  std::memcpy(w.all.y.data(), r, sizeof(T) * static_cast<size_t>(nc));
  T loss = T(0);
  const T* g = nullptr;
  if (nc > 0) {
    loss = ndcg_list(nc, paths, inv_tau, disc, w, with_grad, idcg + q, &g);
  } else {
    idcg[q] = T(0);
  }
  if (with_grad) {
    if (nc > 0) std::memcpy(w.tile_g.data() + t * nc, g, sizeof(T) * static_cast<size_t>(nc));
    if (t == nt - 1)  // the tile's last query: its rows of G, a row segment per item (v.aq = 1)
      transpose_block(w.tile_g.data(), nc, G + q0, v.ac, nc, nt);
  }
  return loss;
}

template <typename T>
void forward_impl(const SmoothNdcgForward& p) {
  const ForwardCall<T> c = forward_call<T>(p.lists, p.sim, p.rel, p.mask, p.tau, p.out, p.ws);
  const T* sim = static_cast<const T*>(p.sim.data);
  const T* rel = static_cast<const T*>(p.rel.data);
  const uint8_t* mask = p.mask.data;
  const bool with_grad = p.with_grad, lists = p.rel_i2t.offsets != nullptr;
  OwnedLists<T> cols;  // the t2i lists, from the rows' (the CPU reads no rel_t2i)
  if (lists && c.L.d2) cols = column_lists<T>(p.rel_i2t, c.n, c.m);
  const ListsIn by_dir[2] = {p.rel_i2t, cols.view()};
  std::vector<T> disc(c.c_max);  // IDCG discounts 1 / log2(1 + p), p = 1..c_max
  for (int64_t i = 0; i < c.c_max; ++i) disc[i] = ndcg_discount(T(i + 1));
  T* idcg = c.ws + c.L.idcg;
  // the column queries of a row-major sim (and relevance matrix) without a mask go in tiles of kColumnTile
  const View& col = c.v[1];
  const bool tiles = c.L.d2 && mask == nullptr && col.sc != 1 && col.sq == 1 && (lists || col.rq == 1);
  run_queries<T>(
      c.L, c.n, c.m, c.work, p.lists.reduction, c.out, c.ws, [&] { return NdcgScratch<T>(c.c_max, lists); },
      [&](NdcgScratch<T>& w, int d, int64_t q, int64_t* counted) {
        T* id = idcg + (d == 0 ? 0 : c.L.nq1);
        if (d == 1 && tiles)
          return column_query(col, q, sim, rel, by_dir[d], p.paths, c.inv_tau, disc.data(), w, with_grad, c.G[d], id,
                              counted);
        return forward_query(c.v[d], q, sim, rel, by_dir[d], mask, p.paths, c.inv_tau, disc.data(), w, with_grad,
                             c.G[d], id, counted);
      },
      tiles ? kColumnTile : 1);
}

// G carries the gradient up to the per-query factor -1 / (tau * IDCG) (0 for a constant loss).
template <typename T>
void backward_impl(const SmoothNdcgBackward& p) {
  const int64_t n = p.lists.n, m = p.lists.m;
  const T tau = static_cast<T>(p.tau);
  const T* ws = static_cast<const T*>(p.ws);
  const SmoothRankLayout L = smooth_rank_layout(n, m, p.lists.direction);
  const T inv_tau = T(1) / tau;
  const T* idcg = ws + L.idcg;
  backward_elementwise<T>(L, p.mask.data, p.mask.s0, p.mask.s1, n, m, p.lists.reduction,
                          static_cast<const T*>(p.grad_out.data), p.grad_out.s, ws, static_cast<T*>(p.grad),
                          [&](int, int64_t qi) {
    return idcg[qi] > T(0) ? -inv_tau / idcg[qi] : T(0);
  });
}

}  // namespace

void smooth_ndcg_forward(const SmoothNdcgForward& p) { FASTRANK_DISPATCH_CPU(p.lists.dt, T, forward_impl<T>(p)); }

// the forward kept G: the backward is elementwise
void smooth_ndcg_backward(const SmoothNdcgBackward& p) { FASTRANK_DISPATCH_CPU(p.lists.dt, T, backward_impl<T>(p)); }

}  // namespace cpu
}  // namespace fastrank
