// The kernel entry points, one list for both backends: (parameter struct, function name) of
// every forward and backward, in the op headers below. cpu.cpp binds it over fastrank::cpu,
// cuda.cpp over fastrank::cuda, each entry with fill.h's `bind` under its function's name.
// A new op adds its header and its entry points here (and nothing in cpu.cpp / cuda.cpp).
#pragma once

#include "fastrank/fast_rerank.h"
#include "fastrank/kendall.h"
#include "fastrank/kendall_sw.h"
#include "fastrank/recall_at_k.h"
#include "fastrank/smooth_ap.h"
#include "fastrank/smooth_ndcg.h"

// X(Struct, function): the struct is <backend>::Struct, the entry point <backend>::function.
#define FASTRANK_ENTRY_POINTS(X)               \
  X(SmoothNdcgForward, smooth_ndcg_forward)    \
  X(SmoothNdcgBackward, smooth_ndcg_backward)  \
  X(SmoothApForward, smooth_ap_forward)        \
  X(RecallAtKForward, recall_at_k_forward)     \
  X(SmoothRankBackward, smooth_rank_backward)  \
  X(KendallForward, kendall_forward)           \
  X(KendallBackward, kendall_backward)         \
  X(KendallSwForward, kendall_sw_forward)      \
  X(KendallSwBackward, kendall_sw_backward)    \
  X(FastRerankLse, fast_rerank_lse)            \
  X(FastRerankForward, fast_rerank_forward)    \
  X(FastRerankBackward, fast_rerank_backward)

// One entry point of the backend namespace FASTRANK_BACKEND (which the binding defines around
// the expansion) into the module `m`.
#define FASTRANK_BIND_ENTRY(Struct, function) \
  ::fastrank::bindings::bind<FASTRANK_BACKEND::Struct>(m, #function, &FASTRANK_BACKEND::function);
