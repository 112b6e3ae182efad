// The codes and sizes both native modules export to Python (fastrank/_native.py reads them;
// Python never types them again). Computed here from the kernels' own headers, so the two
// sides cannot drift. Where a register_fake must stay symbolic under torch.compile, Python
// keeps the formula and tests/test_native_constants.py compares it with these functions.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "fastrank/common.h"
#include "fastrank/kendall.h"
#include "fastrank/params.h"
#include "fastrank/recall_at_k.h"

namespace fastrank {
namespace bindings {

inline void export_constants(pybind11::module_& m) {
  namespace py = pybind11;
  py::dict dtypes;  // torch dtype name -> DType code
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) dtypes[dtype_name(d)] = static_cast<int>(d);
  m.attr("DTYPE_CODE") = dtypes;
  py::dict dirs;
  dirs["i2t"] = static_cast<int>(kI2T);
  dirs["t2i"] = static_cast<int>(kT2I);
  dirs["both"] = static_cast<int>(kBoth);
  m.attr("DIRECTION_CODE") = dirs;
  py::dict reds;
  reds["none"] = static_cast<int>(kNone);
  reds["mean"] = static_cast<int>(kMean);
  reds["sum"] = static_cast<int>(kSum);
  m.attr("REDUCTION_CODE") = reds;
  py::dict paths;
  paths["auto"] = static_cast<int>(kAutoPath);
  paths["dense"] = static_cast<int>(kDensePath);
  paths["sparse"] = static_cast<int>(kSparsePath);
  m.attr("PATH_CODE") = paths;
  m.def("takes_sparse_pass", &takes_sparse_pass,
        "whether a list of len items, np of nonzero gain, takes the sparse pass: (paths, np, len)");
  m.attr("MAX_KS") = kMaxKs;
  m.def("query_count", &query_count, "per-query losses of a direction code: n if i2t, + m if t2i");
  m.def("smooth_rank_ws_numel", &smooth_rank_ws_numel,
        "elements of the smooth-rank workspace (smooth_ndcg, smooth_ap, recall_at_k)");
  m.def("kendall_aux_numel", &kendall_aux_numel, "elements of kendall's and kendall_sw's aux");
}

}  // namespace bindings
}  // namespace fastrank
