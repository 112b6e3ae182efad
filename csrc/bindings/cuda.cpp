// pybind11 bindings of the CUDA kernels: fastrank._C_cuda.
//
// Thin by design, like cpu.cpp: pointers as integers, sizes, element strides, dtype code,
// hyper-parameters and the current cudaStream_t (as an integer) last. A kernel entry
// returns a cudaError_t as int; `check` turns a failure into a RuntimeError.
// Compiled by the host compiler: it includes no CUDA header.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>

#include "constants.h"
#include <stdexcept>
#include <string>

#include "fastrank/kendall.h"
#include "fastrank/kendall_sw.h"
#include "fastrank/fast_rerank.h"
#include "fastrank/recall_at_k.h"
#include "fastrank/runtime.h"
#include "fastrank/smooth_ap.h"
#include "fastrank/smooth_ndcg.h"

namespace py = pybind11;
using fastrank::DType;
using ptr = std::uintptr_t;
using i64 = std::int64_t;

template <typename P> static P* as(ptr p) { return reinterpret_cast<P*>(p); }
// The pieces of a kernel's parameter struct (fastrank/params.h) from the Python arguments.
static fastrank::MatIn mat(ptr p, i64 s0, i64 s1) { return {as<const void>(p), s0, s1}; }
static fastrank::MaskIn mask_of(ptr p, i64 s0, i64 s1) { return {as<const std::uint8_t>(p), s0, s1}; }
static fastrank::Lists lists(int dt, i64 n, i64 m, int dir, int red) { return {DType(dt), n, m, dir, red}; }

static void check(int code, const char* what) {
  if (code != 0)
    throw std::runtime_error(std::string("fastrank CUDA kernel ") + what + " failed: " +
                             fastrank::cuda::error_string(code));
}

PYBIND11_MODULE(_C_cuda, m) {
  m.doc() = "fastrank CUDA kernels; CUDA runtime linked statically; no libtorch";
  m.def("device_count", &fastrank::cuda::device_count);
  m.def("runtime_version", &fastrank::cuda::runtime_version);
  m.def("archs", [] { return std::string(FASTRANK_CUDA_ARCHS); });
  m.def("synchronize", [] { check(fastrank::cuda::synchronize(), "synchronize"); });
  fastrank::bindings::export_constants(m);
  // the forward-only device buffers of the CUDA kernels (accumulation-type elements)
  m.def("smooth_ndcg_partials_numel", &fastrank::cuda::smooth_ndcg_partials_numel);
  m.def("smooth_rank_partials_numel", &fastrank::smooth_rank_partials_numel);

  // ---- smooth_ndcg (csrc/cuda/smooth_ndcg.cu) ----
  // with_grad: the CPU signature's (the CUDA forward always writes what the backward needs)
  m.def("smooth_ndcg_forward", [](int dt, int rdt, ptr sim, i64 ss0, i64 ss1, ptr rel, i64 rs0, i64 rs1,
                                  ptr mask, i64 ms0, i64 ms1, i64 n, i64 mm, int dir, int red, int, double tau,
                                  ptr out, ptr ws, ptr partials, ptr stream) {
    fastrank::cuda::SmoothNdcgForward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.rel_dt = DType(rdt);
    p.sim = mat(sim, ss0, ss1);
    p.rel = mat(rel, rs0, rs1);
    p.mask = mask_of(mask, ms0, ms1);
    p.tau = tau;
    p.out = as<void>(out);
    p.ws = as<void>(ws);
    p.partials = as<void>(partials);
    p.stream = as<void>(stream);
    py::gil_scoped_release nogil;
    check(fastrank::cuda::smooth_ndcg_forward(p), "smooth_ndcg_forward");
  });
  m.def("smooth_ndcg_backward", [](int dt, ptr sim, i64 ss0, i64 ss1, ptr mask, i64 ms0, i64 ms1, i64 n,
                                   i64 mm, int dir, int red, double tau, ptr grad_out, i64 gs, ptr ws,
                                   ptr grad, ptr stream) {
    fastrank::cuda::SmoothNdcgBackward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.sim = mat(sim, ss0, ss1);
    p.mask = mask_of(mask, ms0, ms1);
    p.tau = tau;
    p.grad_out = {as<const void>(grad_out), gs};
    p.ws = as<const void>(ws);
    p.grad = as<void>(grad);
    p.stream = as<void>(stream);
    py::gil_scoped_release nogil;
    check(fastrank::cuda::smooth_ndcg_backward(p), "smooth_ndcg_backward");
  });

  // ---- smooth_ap, recall_at_k and their shared backward (csrc/cuda/smooth_ap.cu, recall_at_k.cu) ----
  m.def("smooth_ap_forward", [](int dt, ptr sim, i64 ss0, i64 ss1, ptr pos, i64 ps0, i64 ps1, ptr mask, i64 ms0,
                                i64 ms1, i64 n, i64 mm, int dir, int red, int with_grad, double tau, ptr out,
                                ptr ws, ptr partials, ptr stream) {
    fastrank::cuda::SmoothApForward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.sim = mat(sim, ss0, ss1);
    p.pos = mask_of(pos, ps0, ps1);
    p.mask = mask_of(mask, ms0, ms1);
    p.tau = tau;
    p.with_grad = with_grad != 0;
    p.out = as<void>(out);
    p.ws = as<void>(ws);
    p.partials = as<void>(partials);
    p.stream = as<void>(stream);
    py::gil_scoped_release nogil;
    check(fastrank::cuda::smooth_ap_forward(p), "smooth_ap_forward");
  });
  m.def("recall_at_k_forward", [](int dt, ptr sim, i64 ss0, i64 ss1, ptr pos, i64 ps0, i64 ps1, ptr mask,
                                  i64 ms0, i64 ms1, i64 n, i64 mm, const std::vector<double>& ks,
                                  const std::vector<double>& tk, int dir, int red, int with_grad, double tau,
                                  ptr out, ptr ws, ptr partials, ptr stream) {
    fastrank::cuda::RecallAtKForward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.sim = mat(sim, ss0, ss1);
    p.pos = mask_of(pos, ps0, ps1);
    p.mask = mask_of(mask, ms0, ms1);
    p.tau = tau;
    p.with_grad = with_grad != 0;
    p.out = as<void>(out);
    p.ws = as<void>(ws);
    p.partials = as<void>(partials);
    p.stream = as<void>(stream);
    p.ks = ks.data();
    p.tk = tk.data();
    p.n_k = static_cast<int>(ks.size());
    py::gil_scoped_release nogil;
    check(fastrank::cuda::recall_at_k_forward(p), "recall_at_k_forward");
  });
  // mask and its strides: the CPU signature's (masked entries of G are 0)
  m.def("smooth_rank_backward", [](int dt, ptr, i64, i64, i64 n, i64 mm, int dir, int red, ptr grad_out,
                                   i64 gs, ptr ws, ptr grad, ptr stream) {
    fastrank::cuda::SmoothRankBackward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.grad_out = {as<const void>(grad_out), gs};
    p.ws = as<const void>(ws);
    p.grad = as<void>(grad);
    p.stream = as<void>(stream);
    py::gil_scoped_release nogil;
    check(fastrank::cuda::smooth_rank_backward(p), "smooth_rank_backward");
  });

  // ---- kendall (csrc/cuda/kendall.cu) ----
  m.def("kendall_forward", [](int dt, int rdt, ptr sim, i64 ss0, i64 ss1, ptr rel, i64 rs0, i64 rs1, ptr mask,
                              i64 ms0, i64 ms1, i64 n, i64 mm, double alpha, int dir, int red, ptr loss, ptr dsim,
                              ptr aux, ptr stream) {
    fastrank::cuda::KendallForward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.rel_dt = DType(rdt);
    p.sim = mat(sim, ss0, ss1);
    p.rel = mat(rel, rs0, rs1);
    p.mask = mask_of(mask, ms0, ms1);
    p.alpha = alpha;
    p.loss = as<void>(loss);
    p.dsim = as<void>(dsim);
    p.aux = as<void>(aux);
    p.stream = as<void>(stream);
    py::gil_scoped_release nogil;
    check(fastrank::cuda::kendall_forward(p), "kendall_forward");
  });
  m.def("kendall_backward", [](int dt, ptr dsim, ptr aux, ptr go, i64 n, i64 mm, int dir, int red, ptr grad, ptr stream) {
    fastrank::cuda::KendallBackward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.dsim = as<const void>(dsim);
    p.aux = as<const void>(aux);
    p.grad_out = as<const void>(go);
    p.grad = as<void>(grad);
    p.stream = as<void>(stream);
    py::gil_scoped_release nogil;
    check(fastrank::cuda::kendall_backward(p), "kendall_backward");
  });

  // ---- kendall_sw (csrc/cuda/kendall_sw.cu) ----
  m.def("kendall_sw_forward", [](int dt, int rdt, ptr sim, i64 ss0, i64 ss1, ptr rel, i64 rs0, i64 rs1, i64 n,
                                 i64 mm, double alpha, double beta, double hi, i64 nw, int dir, int red, ptr loss,
                                 ptr idx, ptr aux, ptr stream) {
    fastrank::cuda::KendallSwForward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.rel_dt = DType(rdt);
    p.sim = mat(sim, ss0, ss1);
    p.rel = mat(rel, rs0, rs1);
    p.alpha = alpha;
    p.beta = beta;
    p.hi = hi;
    p.n_w = nw;
    p.loss = as<void>(loss);
    p.idx = as<std::int32_t>(idx);
    p.aux = as<void>(aux);
    p.stream = as<void>(stream);
    py::gil_scoped_release nogil;
    check(fastrank::cuda::kendall_sw_forward(p), "kendall_sw_forward");
  });
  m.def("kendall_sw_backward", [](int dt, ptr sim, i64 ss0, i64 ss1, ptr idx, i64 nw, ptr aux, ptr go, i64 n,
                                  i64 mm, int dir, int red, ptr grad, ptr stream) {
    fastrank::cuda::KendallSwBackward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.sim = mat(sim, ss0, ss1);
    p.idx = as<const std::int32_t>(idx);
    p.n_w = nw;
    p.aux = as<const void>(aux);
    p.grad_out = as<const void>(go);
    p.grad = as<void>(grad);
    p.stream = as<void>(stream);
    py::gil_scoped_release nogil;
    check(fastrank::cuda::kendall_sw_backward(p), "kendall_sw_backward");
  });

  // ---- fast_rerank (csrc/cuda/fast_rerank.cu) ----
  m.def("fast_rerank_workspace", [](i64 n, i64 mm) { return fastrank::cuda::fast_rerank_workspace(n, mm); });
  m.def("fast_rerank_lse", [](int dt, ptr sim, i64 ssr, i64 ssc, i64 n, i64 mm, double g1, double l1, ptr ws,
                              ptr col_lse, ptr row_lse, ptr stream) {
    fastrank::cuda::FastRerankLse p;
    p.dt = DType(dt);
    p.n = n;
    p.m = mm;
    p.sim = mat(sim, ssr, ssc);
    p.g1 = g1;
    p.l1 = l1;
    p.workspace = as<void>(ws);
    p.col_lse = as<void>(col_lse);
    p.row_lse = as<void>(row_lse);
    p.stream = as<void>(stream);
    py::gil_scoped_release nogil;
    check(fastrank::cuda::fast_rerank_lse(p), "fast_rerank_lse");
  });
  m.def("fast_rerank_forward", [](int dt, ptr sim, i64 ssr, i64 ssc, i64 n, i64 mm, double g1, double g2,
                                  double l1, double l2, ptr ws, ptr col_lse, ptr row_lse, ptr i2t, ptr t2i, ptr stream) {
    fastrank::cuda::FastRerankForward p;
    p.dt = DType(dt);
    p.n = n;
    p.m = mm;
    p.sim = mat(sim, ssr, ssc);
    p.g1 = g1;
    p.g2 = g2;
    p.l1 = l1;
    p.l2 = l2;
    p.workspace = as<void>(ws);
    p.col_lse = as<void>(col_lse);
    p.row_lse = as<void>(row_lse);
    p.i2t = as<void>(i2t);
    p.t2i = as<void>(t2i);
    p.stream = as<void>(stream);
    py::gil_scoped_release nogil;
    check(fastrank::cuda::fast_rerank_forward(p), "fast_rerank_forward");
  });
  m.def("fast_rerank_backward", [](int dt, ptr sim, i64 ssr, i64 ssc, i64 n, i64 mm, ptr gi, i64 gisr,
                                   i64 gisc, ptr gt, i64 gtsr, i64 gtsc, ptr col_lse, ptr row_lse, double g1,
                                   double g2, double l1, double l2, ptr ws, ptr grad, ptr stream) {
    fastrank::cuda::FastRerankBackward p;
    p.dt = DType(dt);
    p.n = n;
    p.m = mm;
    p.sim = mat(sim, ssr, ssc);
    p.g_i2t = mat(gi, gisr, gisc);
    p.g_t2i = mat(gt, gtsr, gtsc);
    p.col_lse = as<const void>(col_lse);
    p.row_lse = as<const void>(row_lse);
    p.g1 = g1;
    p.g2 = g2;
    p.l1 = l1;
    p.l2 = l2;
    p.workspace = as<void>(ws);
    p.grad = as<void>(grad);
    p.stream = as<void>(stream);
    py::gil_scoped_release nogil;
    check(fastrank::cuda::fast_rerank_backward(p), "fast_rerank_backward");
  });
}
