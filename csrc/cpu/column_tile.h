// The column queries (t2i) of a row-major sim that the CPU kernels take together
// (smooth_ndcg.cpp, kendall.cpp; gather_rows and transpose_block, common.h, move them): 64
// neighbouring columns, four cache lines of each row, so that each row's page is visited once per
// 64 queries (16, one line, left smooth-NDCG's t2i direction 1.4x slower than i2t at
// n = m = 4096: a page walk and a cache miss per row and tile).
#pragma once

#include <cstdint>

namespace fastrank {
namespace cpu {
constexpr int64_t kColumnTile = 64;
}  // namespace cpu
}  // namespace fastrank
