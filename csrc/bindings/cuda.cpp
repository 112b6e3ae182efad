// pybind11 bindings of the CUDA kernels: fastrank._C_cuda.
//
// Thin by design, like cpu.cpp: each kernel entry point is bound by fill.h's `bind`, which
// takes the fields of its parameter struct (the op's header) as positional values in
// declaration order: pointers as integers, sizes, element strides, dtype codes,
// hyper-parameters and, every struct's last field, the current cudaStream_t (as an
// integer). A kernel entry returns a cudaError_t as int; Result<int> below turns a failure
// into a RuntimeError naming the entry point.
// Compiled by the host compiler: it includes no CUDA header.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "constants.h"
#include "fill.h"

#include "fastrank/kendall.h"
#include "fastrank/kendall_sw.h"
#include "fastrank/fast_rerank.h"
#include "fastrank/recall_at_k.h"
#include "fastrank/runtime.h"
#include "fastrank/smooth_ap.h"
#include "fastrank/smooth_ndcg.h"

namespace py = pybind11;
using fastrank::bindings::bind;

static void check(int code, const char* what) {
  if (code != 0)
    throw std::runtime_error(std::string("fastrank CUDA kernel ") + what + " failed: " +
                             fastrank::cuda::error_string(code));
}

// a CUDA entry point's cudaError_t: None, or a RuntimeError
template <> struct fastrank::bindings::Result<int> {
  static py::object to_python(int code, const char* what) {
    check(code, what);
    return py::none();
  }
};

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

  namespace k = fastrank::cuda;
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
