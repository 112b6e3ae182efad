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
#include "entry_points.h"
#include "fill.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace py = pybind11;

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
#define FASTRANK_BACKEND k
  FASTRANK_CPU_SIZES(FASTRANK_BIND_SIZE)
  FASTRANK_ENTRY_POINTS(FASTRANK_BIND_ENTRY)
#undef FASTRANK_BACKEND
}
