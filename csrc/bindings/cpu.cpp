// pybind11 bindings of the CPU kernels: the functions of one CPU level's submodule of
// fastrank._C_cpu (e.g. fastrank._C_cpu.avx2). CMakeLists.txt compiles this file once per
// instruction-set level with -Dfastrank=fastrank_<level>, next to that level's kernels;
// csrc/bindings/cpu_dispatch.cpp is the module itself and calls register_kernels of the
// level it picked.
//
// Thin by design: each kernel entry point is bound by fill.h's `bind`, which takes the
// fields of its parameter struct (the op's header, e.g. fastrank/smooth_ndcg.h) as
// positional values in declaration order: pointers as integers (Tensor.data_ptr()), sizes,
// element strides, dtype codes, hyper-parameters. Python (fastrank/ops/) has validated
// shapes, devices, dtypes and strides and allocated every output. The GIL is released while
// a kernel runs.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "constants.h"
#include "fill.h"

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
using fastrank::bindings::bind;

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

  namespace k = fastrank::cpu;
  bind<k::SmoothNdcgForward>(m, "smooth_ndcg_forward", &k::smooth_ndcg_forward);
  bind<k::SmoothNdcgBackward>(m, "smooth_ndcg_backward", &k::smooth_ndcg_backward);
  bind<k::SmoothApForward>(m, "smooth_ap_forward", &k::smooth_ap_forward);
  bind<k::RecallAtKForward>(m, "recall_at_k_forward", &k::recall_at_k_forward);
  bind<k::SmoothRankBackward>(m, "smooth_rank_backward", &k::smooth_rank_backward);
  bind<k::KendallForward>(m, "kendall_forward", &k::kendall_forward);
  bind<k::KendallBackward>(m, "kendall_backward", &k::kendall_backward);
  bind<k::KendallSwForward>(m, "kendall_sw_forward", &k::kendall_sw_forward);
  bind<k::KendallSwBackward>(m, "kendall_sw_backward", &k::kendall_sw_backward);
  m.def("fast_rerank_workspace", &k::fast_rerank_workspace);
  bind<k::FastRerankLse>(m, "fast_rerank_lse", &k::fast_rerank_lse);
  bind<k::FastRerankForward>(m, "fast_rerank_forward", &k::fast_rerank_forward);
  bind<k::FastRerankBackward>(m, "fast_rerank_backward", &k::fast_rerank_backward);
}
