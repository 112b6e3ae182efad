// Fast re-ranking on the CPU (docs/spec.md §3; DVSE, Eq. 13-15). Formulas: fast_rerank.h.
//
// Tiling. The matrix is cut into a fixed grid of R x C bands (R = min(ceil(n / 512), 8)
// row bands, C = min(ceil(m / 1024), 8) column bands; the grid depends on (n, m) only,
// never on the thread count). OpenMP hands out the R * C band tasks. A task walks its
// band in kCB-column sub-tiles, each in kSub-row strips that stay in L1/L2.
// Forward = two sweeps over sim:
//  1. statistics (one read): per sub-tile column the running (max, sum) of g1 * sim over
//     the band's rows (one rescale exp per column per strip, one exp per element, every
//     exponent <= 0); per strip row the (max, sum) of l1 * sim over the sub-tile's columns,
//     folded into the row's running pair of this column band. Each band task owns its
//     partial slots, so the workspace is R * m + C * n (max, sum) pairs: at most
//     16 (n + m) values, O(n + m), never an (n, m) buffer. The partials are merged in band
//     order: bit-identical run to run for any thread count.
//  2. scores (one read, two writes): OpenMP over rows (static), i2t = g2 * s - col_lse[j] and
//     t2i = l2 * s - row_lse[i], vectorised.
// Backward = the same two sweeps: column sums of G1 and row sums of G2 (band partials
// merged in order), then one fused sweep writing grad_sim (formula in fast_rerank.h).
// Memory: outputs + O(n + m) workspace + O(kSub * kCB) per thread. Outputs get a
// transparent-huge-page hint before their first write (common.h: advise_huge_pages):
// page faults on fresh 500 MB outputs otherwise cost more than the arithmetic.
// Non-finite input (docs/spec.md §1): a row holding NaN or +-inf gets a NaN row_lse, a NaN in a
// column makes its col_lse NaN (max_nan), and overflow of g1 * s or l1 * s gives a
// non-finite statistic; the forward returns whether every statistic is finite, which is
// the caller's finiteness check of sim without reading sim again. With the check off,
// NaN/inf reach the outputs (the element's own score is non-finite) and the gradient (every
// gradient element adds poison(sim) = 0 * sim, NaN for a non-finite sim).
// Strided inputs are read through per-thread strip buffers (contiguous rows are read in
// place). The float exp is common.h's vectorisable exp_nonpos. Below 2^16 elements one
// thread does everything (no fork/join).
#include "fastrank/fast_rerank.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

namespace fastrank {
namespace cpu {
namespace {

constexpr int64_t kRB = 512;      // rows per band unit
constexpr int64_t kCB = 1024;     // columns of a sub-tile
constexpr int64_t kSub = 16;      // rows of a strip (kSub x kCB floats = 64 KiB, in L2)
constexpr int64_t kMaxBands = 8;  // row bands and column bands, each at most
constexpr int64_t kParallelMin = int64_t(1) << 16;  // elements below which one thread does it all

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Grid {
  int64_t n, m, R, C, hb, wb;  // bands, band height, band width
  Grid(int64_t n_, int64_t m_) : n(n_), m(m_) {
    R = std::min(cdiv(n, kRB), kMaxBands);
    C = std::min(cdiv(m, kCB), kMaxBands);
    hb = cdiv(n, R);
    wb = cdiv(m, C);
  }
  int64_t tasks() const { return R * C; }
  // task t: row band rb (rows [r0, r1)) x column band cb (columns [b0, b1))
  struct Task {
    int64_t rb, cb, r0, r1, b0, b1;
  };
  Task task(int64_t t) const {
    Task k;
    k.rb = t / C;
    k.cb = t % C;
    k.r0 = k.rb * hb;
    k.r1 = std::min(n, k.r0 + hb);
    k.b0 = k.cb * wb;
    k.b1 = std::min(m, k.b0 + wb);
    return k;
  }
  // small problems run on the calling thread: a fork/join (and, on a busy machine, waiting
  // for a descheduled worker) costs more than the whole sweep
  bool parallel() const { return n * m >= kParallelMin; }
};

// The sweep every pass over the matrix makes, called inside an omp parallel region: the tasks
// shared out dynamically, each task's column band in chunks of at most kCB columns (open(k, c0, w)
// starts a chunk, close(k, c0, w) ends it), each chunk's rows in strips of at most kSub
// (visit(k, c0, w, i0, h)), so a strip of kSub x kCB stays in L1/L2.
template <class Open, class Visit, class Close>
inline void sweep_tasks(const Grid& g, Open&& open, Visit&& visit, Close&& close) {
#pragma omp for schedule(dynamic, 1)
  for (int64_t t = 0; t < g.tasks(); ++t) {
    const Grid::Task k = g.task(t);
    for (int64_t c0 = k.b0; c0 < k.b1; c0 += kCB) {
      const int64_t w = std::min(k.b1 - c0, kCB);
      open(k, c0, w);
      for (int64_t i0 = k.r0; i0 < k.r1; i0 += kSub) visit(k, c0, w, i0, std::min(kSub, k.r1 - i0));
      close(k, c0, w);
    }
  }
}

template <typename A> constexpr A kMaxFinite = std::numeric_limits<A>::max();
template <typename A> inline A vmax(A a, A b) { return a > b ? a : b; }  // omp simd reductions only

// A strip of h rows x w columns starting at p, as (pointer, leading dimension): rows with
// unit column stride are used in place, anything else is gathered into buf (ld = w). Column
// stride 0 (the expanded upstream gradient of a .sum(), the common case) is a fill: a
// strided gather loop there vectorises into AVX-512 gathers of one address, which made the
// whole backward 1.4x slower at the portable avx512 level than with -march=native.
template <typename T>
inline const T* strip(const T* p, int64_t sr, int64_t sc, int64_t h, int64_t w, T* buf, int64_t* ld) {
  if (sc == 1) {
    *ld = sr;
    return p;
  }
  if (sc == 0) {
    for (int64_t r = 0; r < h; ++r) std::fill(buf + r * w, buf + (r + 1) * w, p[r * sr]);
  } else if (sr == 1) {  // column-major source: walk down columns, rows are adjacent in memory
    for (int64_t j = 0; j < w; ++j)
      for (int64_t r = 0; r < h; ++r) buf[r * w + j] = p[j * sc + r];
  } else {
    for (int64_t r = 0; r < h; ++r)
      for (int64_t j = 0; j < w; ++j) buf[r * w + j] = p[r * sr + j * sc];
  }
  *ld = w;
  return buf;
}

// One full row as a contiguous pointer (in place when the column stride is 1; a fill for
// column stride 0, as in strip).
template <typename T>
inline const T* row_of(const T* base, int64_t sr, int64_t sc, int64_t i, int64_t m, T* buf) {
  const T* p = base + i * sr;
  if (sc == 1) return p;
  if (sc == 0) {
    std::fill(buf, buf + m, p[0]);
    return buf;
  }
  for (int64_t j = 0; j < m; ++j) buf[j] = p[j * sc];
  return buf;
}

// log sum_t ps[t] * exp(pm[t]) over k partials (max, sum) stored `stride` apart, in order t.
template <typename A> inline A merge_lse(const A* pm, const A* ps, int64_t stride, int64_t k) {
  A mx = pm[0];
  for (int64_t t = 1; t < k; ++t) mx = max_nan(mx, pm[t * stride]);
  A s = 0;
  for (int64_t t = 0; t < k; ++t) s += ps[t * stride] * exp_nonpos(pm[t * stride] - mx);
  return mx + std::log(s);
}

// ---- pass 1 of the forward: col_lse and row_lse ------------------------------------------
// Called inside an omp parallel region.
template <typename T>
void lse_pass(const T* sim, int64_t sr, int64_t sc, const Grid& g, T g1, T l1, T* ws, T* col_lse,
              T* row_lse) {
  const int64_t n = g.n, m = g.m;
  T* pc_m = ws;                // [row band][j]: column max of g1 * s over the band's rows
  T* pc_s = ws + g.R * m;      //                sum of exp(g1 * s - max)
  T* pr_m = ws + 2 * g.R * m;  // [column band][i]: row max of l1 * s over the band's columns
  T* pr_s = pr_m + g.C * n;    //                   sum of exp(l1 * s - max)
  // per-thread buffers sized to the problem (a small call must not zero 64 KiB): the strip
  // buffer only for strided input
  const int64_t wmax = std::min(kCB, g.wb);
  std::vector<T> buf_v(sc == 1 ? 0 : kSub * wmax), cm_v(wmax), cs_v(wmax), tmax_v(wmax);
  T* __restrict buf = buf_v.data();
  T* __restrict cm = cm_v.data();
  T* __restrict cs = cs_v.data();
  T* __restrict tmax = tmax_v.data();
  const auto open = [&](const Grid::Task&, int64_t, int64_t w) {
    std::fill(cm, cm + w, -std::numeric_limits<T>::infinity());
    std::fill(cs, cs + w, T(0));
  };
  const auto close = [&](const Grid::Task& k, int64_t c0, int64_t w) {
    std::copy(cm, cm + w, pc_m + k.rb * m + c0);
    std::copy(cs, cs + w, pc_s + k.rb * m + c0);
  };
  sweep_tasks(g, open, [&](const Grid::Task& k, int64_t c0, int64_t w, int64_t i0, int64_t h) {
    int64_t ld;
    const T* __restrict b = strip(sim + i0 * sr + c0 * sc, sr, sc, h, w, buf, &ld);
    // columns: max over the strip, rescale the running sum once, then add the strip.
    // max(g1 * s) = g1 * max(s) exactly (g1 > 0, rounding is monotone): exponents <= 0.
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) tmax[j] = b[j];
    for (int64_t r = 1; r < h; ++r) {
      const T* __restrict br = b + r * ld;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) tmax[j] = max_nan(tmax[j], br[j]);
    }
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) {
      const T nm = max_nan(cm[j], g1 * tmax[j]);
      cs[j] *= exp_nonpos(cm[j] - nm);  // cm = -inf on the first strip: exp -> 0
      cm[j] = nm;
    }
    for (int64_t r = 0; r < h; ++r) {
      const T* __restrict br = b + r * ld;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) cs[j] += exp_nonpos(g1 * br[j] - cm[j]);
    }
    // rows: (max, sum) of l1 * s over this sub-tile's columns, folded into the band's pair
    for (int64_t r = 0; r < h; ++r) {
      const T* __restrict br = b + r * ld;
      T mx = br[0], bad = 0;
#pragma omp simd reduction(max : mx) reduction(+ : bad)
      for (int64_t j = 0; j < w; ++j) {
        mx = vmax(mx, br[j]);
        bad += std::fabs(br[j]) <= kMaxFinite<T> ? T(0) : T(1);  // NaN, +-inf
      }
      const T mm = l1 * mx;
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < w; ++j) s += exp_nonpos(l1 * br[j] - mm);
      if (bad != T(0)) s = std::numeric_limits<T>::quiet_NaN();
      const int64_t e = k.cb * n + i0 + r;
      if (c0 == k.b0) {
        pr_m[e] = mm;
        pr_s[e] = s;
      } else {  // online merge, in sub-tile order
        const T om = pr_m[e], nm = max_nan(om, mm);
        pr_s[e] = pr_s[e] * exp_nonpos(om - nm) + s * exp_nonpos(mm - nm);
        pr_m[e] = nm;
      }
    }
  }, close);  // implicit barrier: all partials written
#pragma omp for schedule(static)
  for (int64_t j = 0; j < m; ++j) col_lse[j] = merge_lse(pc_m + j, pc_s + j, m, g.R);
#pragma omp for schedule(static)
  for (int64_t i = 0; i < n; ++i) row_lse[i] = merge_lse(pr_m + i, pr_s + i, n, g.C);
}

template <typename T> bool all_finite(const T* a, int64_t k) {
  T bad = 0;
#pragma omp simd reduction(+ : bad)
  for (int64_t i = 0; i < k; ++i) bad += std::fabs(a[i]) <= kMaxFinite<T> ? T(0) : T(1);
  return bad == T(0);
}

template <typename T>
bool lse_impl(const T* sim, int64_t sr, int64_t sc, int64_t n, int64_t m, T g1, T l1, T* ws, T* col_lse,
              T* row_lse) {
  const Grid g(n, m);
#pragma omp parallel if (g.parallel())
  lse_pass(sim, sr, sc, g, g1, l1, ws, col_lse, row_lse);
  return all_finite(col_lse, m) && all_finite(row_lse, n);
}

template <typename T>
bool forward_impl(const T* sim, int64_t sr, int64_t sc, int64_t n, int64_t m, T g1, T g2, T l1, T l2, T* ws,
                  T* col_lse, T* row_lse, T* i2t, T* t2i) {
  const Grid g(n, m);
  advise_huge_pages(i2t, sizeof(T) * static_cast<size_t>(n * m));
  advise_huge_pages(t2i, sizeof(T) * static_cast<size_t>(n * m));
#pragma omp parallel if (g.parallel())
  {
    lse_pass(sim, sr, sc, g, g1, l1, ws, col_lse, row_lse);  // ends with a barrier
    // ---- pass 2: both score matrices (Eq. 14-15 in log space) ----
    std::vector<T> row_v(sc == 1 ? 0 : m);
    const T* __restrict cl = col_lse;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T* __restrict x = row_of(sim, sr, sc, i, m, row_v.data());
      T* __restrict o1 = i2t + i * m;
      T* __restrict o2 = t2i + i * m;
      const T rl = row_lse[i];
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) {
        o1[j] = g2 * x[j] - cl[j];
        o2[j] = l2 * x[j] - rl;
      }
    }
  }
  return all_finite(col_lse, m) && all_finite(row_lse, n);
}

// out[x] = scale * the sum over bands t of part[t * len + x], in band order (deterministic);
// called inside an omp parallel region.
template <typename T> void sum_bands(const T* part, int64_t bands, int64_t len, T scale, T* out) {
#pragma omp for schedule(static)
  for (int64_t x = 0; x < len; ++x) {
    T s = 0;
    for (int64_t t = 0; t < bands; ++t) s += part[t * len + x];
    out[x] = scale * s;
  }
}

// ---- backward ------------------------------------------------------------------------------
// Workspace: [row band][j] column partial sums of G1, [column band][i] row partial sums of
// G2, then a1[j] = g1 * colsum(G1)[j] and b2[i] = l1 * rowsum(G2)[i].
template <typename T, bool H1, bool H2>
void backward_impl(const T* sim, int64_t sr, int64_t sc, int64_t n, int64_t m, const T* G1, int64_t g1r,
                   int64_t g1c, const T* G2, int64_t g2r, int64_t g2c, const T* col_lse, const T* row_lse,
                   T g1, T g2, T l1, T l2, T* ws, T* grad) {
  const Grid g(n, m);
  T* pc = ws;
  T* pr = ws + g.R * m;
  T* a1 = pr + g.C * n;
  T* b2 = a1 + m;
  advise_huge_pages(grad, sizeof(T) * static_cast<size_t>(n * m));
#pragma omp parallel if (g.parallel())
  {
    const int64_t wmax = std::min(kCB, g.wb);
    std::vector<T> buf_v((H1 && g1c != 1) || (H2 && g2c != 1) ? kSub * wmax : 0), acc_v(H1 ? wmax : 0);
    T* __restrict buf = buf_v.data();
    T* __restrict acc = acc_v.data();
    // pass 1: column sums of G1, row sums of G2, band partials
    const auto open = [&](const Grid::Task&, int64_t, int64_t w) {
      if (H1) std::fill(acc, acc + w, T(0));
    };
    const auto close = [&](const Grid::Task& k, int64_t c0, int64_t w) {
      if (H1) std::copy(acc, acc + w, pc + k.rb * m + c0);
    };
    sweep_tasks(g, open, [&](const Grid::Task& k, int64_t c0, int64_t w, int64_t i0, int64_t h) {
      int64_t ld;
      if (H1) {
        const T* __restrict b = strip(G1 + i0 * g1r + c0 * g1c, g1r, g1c, h, w, buf, &ld);
        for (int64_t r = 0; r < h; ++r) {
          const T* __restrict br = b + r * ld;
#pragma omp simd
          for (int64_t j = 0; j < w; ++j) acc[j] += br[j];
        }
      }
      if (H2) {
        const T* __restrict b = strip(G2 + i0 * g2r + c0 * g2c, g2r, g2c, h, w, buf, &ld);
        for (int64_t r = 0; r < h; ++r) {
          const T* __restrict br = b + r * ld;
          T s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t j = 0; j < w; ++j) s += br[j];
          const int64_t e = k.cb * n + i0 + r;
          pr[e] = c0 == k.b0 ? s : pr[e] + s;
        }
      }
    }, close);
    if (H1) sum_bands(pc, g.R, m, g1, a1);
    if (H2) sum_bands(pr, g.C, n, l1, b2);
    // pass 2: grad = g2 G1 - P * a1[j] + l2 G2 - Q * b2[i] (+ poison(sim): NaN for a
    // non-finite sim even where the formula's exp would drop it, e.g. sim = -inf)
    std::vector<T> xs_v(sc == 1 ? 0 : m), r1_v(H1 && g1c != 1 ? m : 0), r2_v(H2 && g2c != 1 ? m : 0);
    const T* __restrict cl = col_lse;
    const T* __restrict a = a1;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T* __restrict x = row_of(sim, sr, sc, i, m, xs_v.data());
      const T* __restrict y1 = H1 ? row_of(G1, g1r, g1c, i, m, r1_v.data()) : nullptr;
      const T* __restrict y2 = H2 ? row_of(G2, g2r, g2c, i, m, r2_v.data()) : nullptr;
      const T rl = row_lse[i], b = H2 ? b2[i] : T(0);
      T* __restrict out = grad + i * m;
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) {
        T v = poison(x[j]);
        if (H1) v += g2 * y1[j] - exp_nonpos(g1 * x[j] - cl[j]) * a[j];
        if (H2) v += l2 * y2[j] - exp_nonpos(l1 * x[j] - rl) * b;
        out[j] = v;
      }
    }
  }
}

template <typename T>
void backward_dispatch(const T* sim, int64_t sr, int64_t sc, int64_t n, int64_t m, const T* G1, int64_t g1r,
                       int64_t g1c, const T* G2, int64_t g2r, int64_t g2c, const T* cl, const T* rl, T g1,
                       T g2, T l1, T l2, T* ws, T* grad) {
  if (G1 && G2)
    backward_impl<T, true, true>(sim, sr, sc, n, m, G1, g1r, g1c, G2, g2r, g2c, cl, rl, g1, g2, l1, l2, ws, grad);
  else if (G1)
    backward_impl<T, true, false>(sim, sr, sc, n, m, G1, g1r, g1c, G2, g2r, g2c, cl, rl, g1, g2, l1, l2, ws, grad);
  else if (G2)
    backward_impl<T, false, true>(sim, sr, sc, n, m, G1, g1r, g1c, G2, g2r, g2c, cl, rl, g1, g2, l1, l2, ws, grad);
  else
    backward_impl<T, false, false>(sim, sr, sc, n, m, G1, g1r, g1c, G2, g2r, g2c, cl, rl, g1, g2, l1, l2, ws,
                                   grad);  // zeros (NaN where sim is not finite)
}

int64_t workspace_size(int64_t n, int64_t m) {
  const Grid g(n, m);
  return 2 * (g.R * m + g.C * n);  // >= backward's R*m + C*n + m + n; <= 16 (n + m)
}

// The caller's workspace, or (workspace == nullptr) one allocated here for the call: on the
// CPU that spares the Python side an allocation and a size query per pass.
template <typename T> struct Workspace {
  std::unique_ptr<T[]> own;
  T* p;
  Workspace(void* given, int64_t n, int64_t m)
      : own(given ? nullptr : new T[static_cast<size_t>(workspace_size(n, m))]),
        p(given ? static_cast<T*>(given) : own.get()) {}
};

}  // namespace

int64_t fast_rerank_workspace(int64_t n, int64_t m) { return workspace_size(n, m); }

bool fast_rerank_lse(const FastRerankLse& p) {
  const int64_t n = p.n, m = p.m;
  bool ok = true;
  FASTRANK_DISPATCH_CPU(p.dt, T,
      Workspace<T> ws(p.workspace, n, m);
      ok = lse_impl<T>(static_cast<const T*>(p.sim.data), p.sim.s0, p.sim.s1, n, m, static_cast<T>(p.g1),
                       static_cast<T>(p.l1), ws.p, static_cast<T*>(p.col_lse), static_cast<T*>(p.row_lse)));
  return ok;
}

bool fast_rerank_forward(const FastRerankForward& p) {
  const int64_t n = p.n, m = p.m;
  bool ok = true;
  FASTRANK_DISPATCH_CPU(p.dt, T,
      Workspace<T> ws(p.workspace, n, m);
      ok = forward_impl<T>(static_cast<const T*>(p.sim.data), p.sim.s0, p.sim.s1, n, m, static_cast<T>(p.g1),
                           static_cast<T>(p.g2), static_cast<T>(p.l1), static_cast<T>(p.l2),
                           ws.p, static_cast<T*>(p.col_lse), static_cast<T*>(p.row_lse),
                           static_cast<T*>(p.i2t), static_cast<T*>(p.t2i)));
  return ok;
}

void fast_rerank_backward(const FastRerankBackward& p) {
  const int64_t n = p.n, m = p.m;
  FASTRANK_DISPATCH_CPU(p.dt, T,
      Workspace<T> ws(p.workspace, n, m);
      backward_dispatch<T>(static_cast<const T*>(p.sim.data), p.sim.s0, p.sim.s1, n, m,
                           static_cast<const T*>(p.g_i2t.data), p.g_i2t.s0, p.g_i2t.s1,
                           static_cast<const T*>(p.g_t2i.data), p.g_t2i.s0, p.g_t2i.s1,
                           static_cast<const T*>(p.col_lse), static_cast<const T*>(p.row_lse),
                           static_cast<T>(p.g1), static_cast<T>(p.g2), static_cast<T>(p.l1), static_cast<T>(p.l2),
                           ws.p, static_cast<T*>(p.grad)));
}

}  // namespace cpu
}  // namespace fastrank
