// fastrank/launch.h: how every CUDA launcher starts a kernel, and the launch-shape limits.
//
//   return launch(kernel, grid, block, shared_bytes, stream, args...);
//
// is `kernel<<<grid, block, shared_bytes, stream>>>(args...)` followed by
// cudaGetLastError(), returned as int (0 = success), the convention of every entry point.
// The arguments go through the kernel's own parameter list (non-deduced `Same<P>::type`),
// so they convert exactly as they would in the triple-chevron form.
//
// Why one helper instead of `<<<...>>>` at each call site: the same .cu sources are also
// compiled by the host compiler against the SIMT emulator in tests/simt (FASTRANK_SIMT
// defined), which runs the kernels' threads as fibers on the CPU to check their logic
// without a GPU. The emulator replaces this one definition; the kernels themselves stay
// plain CUDA and their call sites still read as launches. The alternative, rewriting every
// `<<<...>>>` at build time, would make the emulated code a transformed copy of the source,
// with its own line numbers and its own failure modes.
//
// Limits (CUDA compute capability >= 7.0): gridDim.x <= 2^31 - 1, gridDim.y and .z <= 65535,
// at most 1024 threads a block (and at most the kernel's __launch_bounds__), 48 KiB of
// static shared memory. Launchers that tile an (n, m) matrix put the tiles on a flat
// gridDim.x (flat_grid) or loop over grid-strided blocks, never on gridDim.y alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

namespace fastrank {
namespace cuda {

constexpr int64_t kMaxGridX = 2147483647;  // gridDim.x
constexpr int64_t kMaxGridYZ = 65535;      // gridDim.y, gridDim.z

template <typename T> struct Same { using type = T; };

// The second argument of a kernel's __launch_bounds__, by element type T: the blocks of
// `threads` threads that must fit on one SM together, so ptxas keeps every thread within
// 65536 / (blocks * threads) registers. Given the block size alone, ptxas (CUDA 13) picks a
// register target of its own per kernel and arch and, for several kernels here, spilled to
// local memory to meet it; a stated minimum is a budget it allocates to instead. double
// values take two registers, so double instantiations ask for fewer blocks. The numbers are
// chosen per kernel from ptxas's report, and tests/test_cuda_resources.py fails on any spill
// (docs/cuda-resources.md: the table, and why each kernel's occupancy is enough).
template <typename T> constexpr int min_blocks(int for_float, int for_double) {
  return std::is_same<T, double>::value ? for_double : for_float;
}

// `#pragma unroll` for nvcc (a loop over the two directions whose per-direction values
// live in small arrays: unrolled, they are registers; not unrolled, local memory). The
// host compiler of the SIMT emulator gets nothing (GCC warns on the unknown pragma).
#if defined(FASTRANK_SIMT)
#define FASTRANK_UNROLL
#else
#define FASTRANK_UNROLL _Pragma("unroll")
#endif

#if defined(FASTRANK_SIMT)
template <typename... P>
inline int launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                  typename Same<P>::type... args) {
  return ::simt::launch(kernel, grid, block, shared_bytes, stream, args...);
}
#else
template <typename... P>
inline int launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                  typename Same<P>::type... args) {
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
  return static_cast<int>(cudaGetLastError());
}
#endif

// A flat 1-D grid of `tiles` blocks (e.g. row tiles x column tiles of a matrix, decoded in
// the kernel with / and %), or 0 blocks when that exceeds gridDim.x: the caller then
// returns cudaErrorInvalidConfiguration before launching anything.
inline unsigned flat_grid(int64_t tiles) {
  return tiles >= 1 && tiles <= kMaxGridX ? static_cast<unsigned>(tiles) : 0u;
}

// Blocks of a grid-strided loop over `items` (one block per item up to `cap`, then each
// block takes items blockIdx.x, blockIdx.x + gridDim.x, ...). At least one block.
inline unsigned strided_grid(int64_t items, int64_t cap = kMaxGridX) {
  const int64_t b = items < cap ? items : cap;
  return static_cast<unsigned>(b > 0 ? b : 1);
}

}  // namespace cuda
}  // namespace fastrank
