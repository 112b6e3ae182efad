// The kernel entry points, one list for both backends: the function name of every forward
// and backward, declared in the op headers below. cpu.cpp binds it over fastrank::cpu,
// cuda.cpp over fastrank::cuda, each entry with fill.h's `bind` under its function's name
// (the parameter struct is the entry point's argument type, per backend).
// A new op adds its header, its entry points and any buffer size Python asks for here (and
// nothing in cpu.cpp / cuda.cpp).
#pragma once

#include "fastrank/fast_rerank.h"
#include "fastrank/kendall.h"
#include "fastrank/kendall_sw.h"
#include "fastrank/recall_at_k.h"
#include "fastrank/smooth_ap.h"
#include "fastrank/smooth_ndcg.h"

// X(function): the entry point <backend>::function.
#define FASTRANK_ENTRY_POINTS(X) \
  X(smooth_ndcg_forward)         \
  X(smooth_ndcg_backward)        \
  X(smooth_ap_forward)           \
  X(recall_at_k_forward)         \
  X(smooth_rank_backward)        \
  X(kendall_forward)             \
  X(kendall_backward)            \
  X(kendall_sw_forward)          \
  X(kendall_sw_backward)         \
  X(fast_rerank_lse)             \
  X(fast_rerank_forward)         \
  X(fast_rerank_backward)

// X(function): the buffer sizes a backend's kernels need that Python asks the module for
// (elements of one call's buffer, <backend>::function(n, m[, direction])).
#define FASTRANK_CPU_SIZES(X) X(fast_rerank_workspace)
#define FASTRANK_CUDA_SIZES(X) \
  X(fast_rerank_workspace)      \
  X(smooth_ndcg_partials_numel) \
  X(smooth_rank_partials_numel) \
  X(kendall_partials_numel)

// One size function of the backend namespace FASTRANK_BACKEND into the module `m`.
#define FASTRANK_BIND_SIZE(function) m.def(#function, &FASTRANK_BACKEND::function);

// One entry point of the backend namespace FASTRANK_BACKEND (which the binding defines around
// the expansion) into the module `m`.
#define FASTRANK_BIND_ENTRY(function) \
  ::fastrank::bindings::bind(m, #function, &FASTRANK_BACKEND::function);
