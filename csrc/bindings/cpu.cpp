// pybind11 bindings of the CPU kernels: the functions of one CPU level's submodule of
// fastrank._C_cpu (e.g. fastrank._C_cpu.avx2). CMakeLists.txt compiles this file once per
// instruction-set level with -Dfastrank=fastrank_<level>, next to that level's kernels;
// csrc/bindings/cpu_dispatch.cpp is the module itself and calls register_kernels of the
// level it picked.
//
// Thin by design: every argument is a pointer (as an integer from Tensor.data_ptr()),
// a size, an element stride, a dtype code or a hyper-parameter. Python (fastrank/ops/)
// has validated shapes, devices, dtypes and strides and allocated every output.
// The GIL is released while a kernel runs.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>

#include "constants.h"

#include "fastrank/kendall.h"
#include "fastrank/kendall_sw.h"
#include "fastrank/fast_rerank.h"
#include "fastrank/recall_at_k.h"
#include "fastrank/smooth_ap.h"
#include "fastrank/smooth_ndcg.h"


#ifdef _OPENMP
#include <omp.h>
#endif

namespace py = pybind11;
using fastrank::DType;
using ptr = std::uintptr_t;
using i64 = std::int64_t;

template <typename P> static P* as(ptr p) { return reinterpret_cast<P*>(p); }
// The pieces of a kernel's parameter struct (fastrank/params.h) from the Python arguments.
static fastrank::MatIn mat(ptr p, i64 s0, i64 s1) { return {as<const void>(p), s0, s1}; }
static fastrank::MaskIn mask_of(ptr p, i64 s0, i64 s1) { return {as<const std::uint8_t>(p), s0, s1}; }
static fastrank::Lists lists(int dt, i64 n, i64 m, int dir, int red) { return {DType(dt), n, m, dir, red}; }

namespace fastrank {
void register_kernels(py::module_& m);  // this level's functions into m
}

void fastrank::register_kernels(py::module_& m) {
  m.doc() = "fastrank CPU kernels (C++17 + OpenMP); no libtorch";
  m.def("max_threads", [] {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
  });
  m.def("compiler", [] { return std::string(FASTRANK_COMPILER); });
  fastrank::bindings::export_constants(m);

  // ---- smooth_ndcg (csrc/cpu/smooth_ndcg.cpp) ----
  m.def("smooth_ndcg_forward", [](int dt, ptr sim, i64 ss0, i64 ss1, ptr rel, i64 rs0, i64 rs1, ptr mask,
                                  i64 ms0, i64 ms1, i64 n, i64 mm, int dir, int red, int with_grad, double tau,
                                  ptr out, ptr ws) {
    fastrank::cpu::SmoothNdcgForward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.sim = mat(sim, ss0, ss1);
    p.rel = mat(rel, rs0, rs1);
    p.mask = mask_of(mask, ms0, ms1);
    p.tau = tau;
    p.with_grad = with_grad != 0;
    p.out = as<void>(out);
    p.ws = as<void>(ws);
    py::gil_scoped_release nogil;
    fastrank::cpu::smooth_ndcg_forward(p);
  });
  // sim and its strides: the CUDA signature's (the CPU backward is elementwise over ws)
  m.def("smooth_ndcg_backward", [](int dt, ptr, i64, i64, ptr mask, i64 ms0, i64 ms1, i64 n, i64 mm, int dir,
                                   int red, double tau, ptr grad_out, i64 gs, ptr ws, ptr grad) {
    fastrank::cpu::SmoothNdcgBackward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.mask = mask_of(mask, ms0, ms1);
    p.tau = tau;
    p.grad_out = {as<const void>(grad_out), gs};
    p.ws = as<const void>(ws);
    p.grad = as<void>(grad);
    py::gil_scoped_release nogil;
    fastrank::cpu::smooth_ndcg_backward(p);
  });

  // ---- smooth_ap, recall_at_k and their shared backward (csrc/cpu/smooth_ap.cpp, recall_at_k.cpp) ----
  m.def("smooth_ap_forward", [](int dt, ptr sim, i64 ss0, i64 ss1, ptr pos, i64 ps0, i64 ps1, ptr mask, i64 ms0,
                                i64 ms1, i64 n, i64 mm, int dir, int red, int with_grad, double tau, ptr out,
                                ptr ws) {
    fastrank::cpu::SmoothApForward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.sim = mat(sim, ss0, ss1);
    p.pos = mask_of(pos, ps0, ps1);
    p.mask = mask_of(mask, ms0, ms1);
    p.tau = tau;
    p.with_grad = with_grad != 0;
    p.out = as<void>(out);
    p.ws = as<void>(ws);
    py::gil_scoped_release nogil;
    fastrank::cpu::smooth_ap_forward(p);
  });
  m.def("recall_at_k_forward", [](int dt, ptr sim, i64 ss0, i64 ss1, ptr pos, i64 ps0, i64 ps1, ptr mask,
                                  i64 ms0, i64 ms1, i64 n, i64 mm, const std::vector<double>& ks,
                                  const std::vector<double>& tk, int dir, int red, int with_grad, double tau,
                                  ptr out, ptr ws) {
    fastrank::cpu::RecallAtKForward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.sim = mat(sim, ss0, ss1);
    p.pos = mask_of(pos, ps0, ps1);
    p.mask = mask_of(mask, ms0, ms1);
    p.tau = tau;
    p.with_grad = with_grad != 0;
    p.out = as<void>(out);
    p.ws = as<void>(ws);
    p.ks = ks.data();
    p.tk = tk.data();
    p.n_k = static_cast<int>(ks.size());
    py::gil_scoped_release nogil;
    fastrank::cpu::recall_at_k_forward(p);
  });
  m.def("smooth_rank_backward", [](int dt, ptr mask, i64 ms0, i64 ms1, i64 n, i64 mm, int dir, int red, ptr grad_out,
                                   i64 gs, ptr ws, ptr grad) {
    fastrank::cpu::SmoothRankBackward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.mask = mask_of(mask, ms0, ms1);
    p.grad_out = {as<const void>(grad_out), gs};
    p.ws = as<const void>(ws);
    p.grad = as<void>(grad);
    py::gil_scoped_release nogil;
    fastrank::cpu::smooth_rank_backward(p);
  });

  // ---- kendall (csrc/cpu/kendall.cpp) ----
  m.def("kendall_forward", [](int dt, int rdt, ptr sim, i64 ss0, i64 ss1, ptr rel, i64 rs0, i64 rs1, ptr mask,
                              i64 ms0, i64 ms1, i64 n, i64 mm, double alpha, int dir, int red, ptr loss, ptr dsim,
                              ptr aux) {
    fastrank::cpu::KendallForward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.rel_dt = DType(rdt);
    p.sim = mat(sim, ss0, ss1);
    p.rel = mat(rel, rs0, rs1);
    p.mask = mask_of(mask, ms0, ms1);
    p.alpha = alpha;
    p.loss = as<void>(loss);
    p.dsim = as<void>(dsim);
    p.aux = as<void>(aux);
    py::gil_scoped_release nogil;
    fastrank::cpu::kendall_forward(p);
  });
  m.def("kendall_backward", [](int dt, ptr dsim, ptr aux, ptr go, i64 n, i64 mm, int dir, int red, ptr grad) {
    fastrank::cpu::KendallBackward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.dsim = as<const void>(dsim);
    p.aux = as<const void>(aux);
    p.grad_out = as<const void>(go);
    p.grad = as<void>(grad);
    py::gil_scoped_release nogil;
    fastrank::cpu::kendall_backward(p);
  });

  // ---- kendall_sw (csrc/cpu/kendall_sw.cpp) ----
  m.def("kendall_sw_forward", [](int dt, int rdt, ptr sim, i64 ss0, i64 ss1, ptr rel, i64 rs0, i64 rs1, i64 n,
                                 i64 mm, double alpha, double beta, double hi, i64 nw, int dir, int red, ptr loss,
                                 ptr idx, ptr aux) {
    fastrank::cpu::KendallSwForward p;
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
    py::gil_scoped_release nogil;
    fastrank::cpu::kendall_sw_forward(p);
  });
  m.def("kendall_sw_backward", [](int dt, ptr sim, i64 ss0, i64 ss1, ptr idx, i64 nw, ptr aux, ptr go, i64 n,
                                  i64 mm, int dir, int red, ptr grad) {
    fastrank::cpu::KendallSwBackward p;
    p.lists = lists(dt, n, mm, dir, red);
    p.sim = mat(sim, ss0, ss1);
    p.idx = as<const std::int32_t>(idx);
    p.n_w = nw;
    p.aux = as<const void>(aux);
    p.grad_out = as<const void>(go);
    p.grad = as<void>(grad);
    py::gil_scoped_release nogil;
    fastrank::cpu::kendall_sw_backward(p);
  });

  // ---- fast_rerank (csrc/cpu/fast_rerank.cpp) ----
  m.def("fast_rerank_workspace", [](i64 n, i64 mm) { return fastrank::cpu::fast_rerank_workspace(n, mm); });
  m.def("fast_rerank_lse", [](int dt, ptr sim, i64 ssr, i64 ssc, i64 n, i64 mm, double g1, double l1, ptr ws,
                              ptr col_lse, ptr row_lse) {
    fastrank::cpu::FastRerankLse p;
    p.dt = DType(dt);
    p.n = n;
    p.m = mm;
    p.sim = mat(sim, ssr, ssc);
    p.g1 = g1;
    p.l1 = l1;
    p.workspace = as<void>(ws);
    p.col_lse = as<void>(col_lse);
    p.row_lse = as<void>(row_lse);
    py::gil_scoped_release nogil;
    return fastrank::cpu::fast_rerank_lse(p);
  });
  m.def("fast_rerank_forward", [](int dt, ptr sim, i64 ssr, i64 ssc, i64 n, i64 mm, double g1, double g2,
                                  double l1, double l2, ptr ws, ptr col_lse, ptr row_lse, ptr i2t, ptr t2i) {
    fastrank::cpu::FastRerankForward p;
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
    py::gil_scoped_release nogil;
    return fastrank::cpu::fast_rerank_forward(p);
  });
  m.def("fast_rerank_backward", [](int dt, ptr sim, i64 ssr, i64 ssc, i64 n, i64 mm, ptr gi, i64 gisr,
                                   i64 gisc, ptr gt, i64 gtsr, i64 gtsc, ptr col_lse, ptr row_lse, double g1,
                                   double g2, double l1, double l2, ptr ws, ptr grad) {
    fastrank::cpu::FastRerankBackward p;
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
    py::gil_scoped_release nogil;
    fastrank::cpu::fast_rerank_backward(p);
  });
}
