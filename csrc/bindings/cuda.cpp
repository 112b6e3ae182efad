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
#include "entry_points.h"
#include "fill.h"

#include "fastrank/runtime.h"

namespace py = pybind11;

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
  namespace k = fastrank::cuda;
#define FASTRANK_BACKEND k
  FASTRANK_CUDA_SIZES(FASTRANK_BIND_SIZE)  // incl. the forward-only device buffers (accumulation-type elements)
  FASTRANK_ENTRY_POINTS(FASTRANK_BIND_ENTRY)
#undef FASTRANK_BACKEND
}
