// simt.h: a SIMT emulator that runs fastrank's CUDA kernels on the CPU, to check their
// logic without a GPU (what it checks and what it cannot: tests/simt/README.md).
//
// The kernels in csrc/cuda/*.cu are compiled unchanged by the host compiler, with
// tests/simt/cuda_runtime.h force-included first (it includes this header). Each launch
// goes through fastrank::cuda::launch (csrc/include/fastrank/launch.h), which calls
// simt::launch below. The emulator then
//  - checks the launch shape as the hardware would (block <= 1024 threads and <= the
//    kernel's __launch_bounds__, gridDim.y/.z <= 65535, gridDim.x <= 2^31 - 1, static
//    shared memory <= 48 KiB) and fails the launch with the CUDA error a GPU would give;
//  - runs the blocks one after another, in the order the schedule says (forward, reversed
//    or a seeded shuffle), and each block's threads as cooperative fibers (ucontext) that
//    switch only at __syncthreads() and at warp collectives (__shfl_*_sync, __ballot_sync,
//    __syncwarp, ...): between two such points a thread runs alone, and the schedule
//    decides which thread runs first, so two schedules that give different bits expose a
//    race (tests run every case under at least two);
//  - requires every live thread of a block at the same __syncthreads() (a thread that
//    returned while others wait, or threads at different barriers, fail the launch), and
//    every lane of a warp collective's mask at the same collective, with exact lane
//    semantics for the shuffles (width, out-of-segment lanes keep their own value);
//  - gives `__shared__` one instance per block (a static in the section simt_shared), filled
//    with the schedule's poison byte when each block starts, so reading shared memory that
//    no thread wrote changes the result between schedules; a guard follows each variable
//    and, under AddressSanitizer, every shared byte outside the running kernel's own
//    variables is poisoned (an out-of-bounds shared access is reported);
//  - reads the sizes of a kernel's shared variables and its name from the module's ELF
//    symbol table, and its __launch_bounds__ from the registration that tests/simt/build.py
//    generates next to each .cu file.
// Global memory is host memory (torch CPU tensors): AddressSanitizer and UBSan, built into
// the emulated module, report out-of-bounds reads and writes.
// Not supported (the kernels use none of them): dynamic shared memory, cooperative groups,
// texture and constant memory, streams other than "run now".
#pragma once

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>

#include <driver_types.h>  // cudaError_t, cudaStream_t (the CUDA toolkit's own header)
#include <vector_types.h>  // dim3, uint3

namespace simt {

struct Site {  // a call site of a barrier or collective: threads must meet at the same one
  const char* file;
  int line;
};

// ---- what a running thread sees --------------------------------------------------------
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();

// ---- block barrier and warp collectives (the only points where a fiber yields) -----------
enum class BarrierOp : int { kSync = 0, kCount = 1, kAnd = 2, kOr = 3 };
int barrier(Site site, BarrierOp op, int predicate);

enum class WarpOp : int { kShflIdx = 0, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kSyncWarp };
// value: the lane's operand (up to 8 bytes, zero-extended); arg: the lane / delta / lane
// mask of a shuffle. Returns the lane's result (the bits of the shuffled value, the ballot
// mask, or the vote).
uint64_t warp_collective(Site site, WarpOp op, unsigned mask, uint64_t value, int arg, int width);

template <typename T> uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp shuffles take values of up to 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T> T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
template <typename T> T shfl(Site s, WarpOp op, unsigned mask, T v, int arg, int width = 32) {
  return from_bits<T>(warp_collective(s, op, mask, to_bits(v), arg, width));
}

// ---- launching ---------------------------------------------------------------------------
struct Body {  // one thread's work: the kernel called with the launch's arguments
  void (*invoke)(const void*);
  const void* state;
};
int run_launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, Body body);

template <typename... P>
int launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, P... args) {
  struct State {
    void (*kernel)(P...);
    std::tuple<P...> args;
  };
  const State state{kernel, std::tuple<P...>(args...)};
  Body body{[](const void* p) {
              const State& s = *static_cast<const State*>(p);
              std::apply(s.kernel, s.args);  // each thread gets its own copy of the arguments
            },
            &state};
  return run_launch(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, stream, body);
}

// The __launch_bounds__ of a kernel, by its unqualified name (build.py generates the calls).
bool register_bounds(const char* kernel, int max_threads, const char* file, int line);

// ---- atomics: fibers never switch inside one, so a plain read-modify-write is atomic ------
template <typename T> T atomic_rmw(T* p, T v, int op) {
  const T old = *p;
  switch (op) {
    case 0: *p = old + v; break;
    case 1: *p = old - v; break;
    case 2: *p = v < old ? v : old; break;
    case 3: *p = v > old ? v : old; break;
    case 4: *p = v; break;
  }
  return old;
}

template <typename T> struct Id { using type = T; };

// ---- the special-function unit's approximations (simt.cpp) ------------------------------------
// Each returns the correctly rounded result moved by up to the documented error, in ulps of the
// result: ex2.approx.ftz.f32 (exp2_approx of common.h) and rcp.approx.ftz.f32 (rcp_approx) 2 ulp
// (CUDA C++ Programming Guide: exp2f 2 ulp; __fdividef 2 ulp for a divisor in [2^-126, 2^126]),
// __expf 2 + floor(|1.173 x|) ulp (the guide's bound), __fdividef 2 ulp; the ftz forms flush
// denormal inputs and results to zero. How far, by the mode (simt_approx): 0 exact; 1 (the
// default) a pseudo-random offset in [-E, E] from a hash of the operation, its input bits and
// a seed (the same input gives the same result under every schedule); 2 always +E; 3 always -E.
float ex2_approx(float x);
float rcp_approx(float x);
float expf_approx(float x);
float fdividef_approx(float a, float b);

inline void syncwarp(Site site, unsigned mask = 0xffffffffu) {
  (void)warp_collective(site, WarpOp::kSyncWarp, mask, 0, 0, 32);
}
struct SyncWarp {  // __syncwarp() and __syncwarp(mask) at one call site
  Site site;
  void operator()(unsigned mask = 0xffffffffu) const { syncwarp(site, mask); }
};

}  // namespace simt

// ---- the CUDA names the kernels use ---------------------------------------------------------
#define SIMT_SITE (::simt::Site{__FILE__, __LINE__})
#define SIMT_CAT2(a, b) a##b
#define SIMT_CAT(a, b) SIMT_CAT2(a, b)

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// One static per block (blocks run one at a time), in a section of its own, preceded by a
// 64-byte guard: see the header comment.
#define __shared__                                                                              \
  [[maybe_unused]] static __attribute__((section("simt_shared"), used, aligned(64))) unsigned char \
      SIMT_CAT(simt_guard_, __COUNTER__)[64];                                                   \
  static __attribute__((section("simt_shared"), aligned(16)))

#define threadIdx (::simt::thread_idx())
#define blockIdx (::simt::block_idx())
#define blockDim (::simt::block_dim())
#define gridDim (::simt::grid_dim())
#define warpSize 32

#define __syncthreads() ((void)::simt::barrier(SIMT_SITE, ::simt::BarrierOp::kSync, 1))
#define __syncthreads_count(p) ::simt::barrier(SIMT_SITE, ::simt::BarrierOp::kCount, (p) ? 1 : 0)
#define __syncthreads_and(p) ::simt::barrier(SIMT_SITE, ::simt::BarrierOp::kAnd, (p) ? 1 : 0)
#define __syncthreads_or(p) ::simt::barrier(SIMT_SITE, ::simt::BarrierOp::kOr, (p) ? 1 : 0)
#define __shfl_sync(m, v, ...) ::simt::shfl(SIMT_SITE, ::simt::WarpOp::kShflIdx, m, v, __VA_ARGS__)
#define __shfl_up_sync(m, v, ...) ::simt::shfl(SIMT_SITE, ::simt::WarpOp::kShflUp, m, v, __VA_ARGS__)
#define __shfl_down_sync(m, v, ...) ::simt::shfl(SIMT_SITE, ::simt::WarpOp::kShflDown, m, v, __VA_ARGS__)
#define __shfl_xor_sync(m, v, ...) ::simt::shfl(SIMT_SITE, ::simt::WarpOp::kShflXor, m, v, __VA_ARGS__)
#define __ballot_sync(m, p) \
  static_cast<unsigned>(::simt::warp_collective(SIMT_SITE, ::simt::WarpOp::kBallot, m, (p) ? 1 : 0, 0, 32))
#define __any_sync(m, p) \
  static_cast<int>(::simt::warp_collective(SIMT_SITE, ::simt::WarpOp::kAny, m, (p) ? 1 : 0, 0, 32))
#define __all_sync(m, p) \
  static_cast<int>(::simt::warp_collective(SIMT_SITE, ::simt::WarpOp::kAll, m, (p) ? 1 : 0, 0, 32))
#define __syncwarp(...) ::simt::SyncWarp{SIMT_SITE}(__VA_ARGS__)  // with or without a mask, in ISO C++17

inline void __threadfence() {}
inline void __threadfence_block() {}

// atomics (the pointer's type decides T; the value converts to it, as in CUDA)
template <typename T> T atomicAdd(T* p, typename ::simt::Id<T>::type v) { return ::simt::atomic_rmw(p, v, 0); }
template <typename T> T atomicSub(T* p, typename ::simt::Id<T>::type v) { return ::simt::atomic_rmw(p, v, 1); }
template <typename T> T atomicMin(T* p, typename ::simt::Id<T>::type v) { return ::simt::atomic_rmw(p, v, 2); }
template <typename T> T atomicMax(T* p, typename ::simt::Id<T>::type v) { return ::simt::atomic_rmw(p, v, 3); }
template <typename T> T atomicExch(T* p, typename ::simt::Id<T>::type v) { return ::simt::atomic_rmw(p, v, 4); }
template <typename T>
T atomicCAS(T* p, typename ::simt::Id<T>::type compare, typename ::simt::Id<T>::type v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}

// ---- device intrinsics: host equivalents ------------------------------------------------------
// Bit casts.
inline unsigned int __float_as_uint(float x) { return ::simt::from_bits<unsigned int>(::simt::to_bits(x)); }
inline int __float_as_int(float x) { return ::simt::from_bits<int>(::simt::to_bits(x)); }
inline float __uint_as_float(unsigned int x) { return ::simt::from_bits<float>(::simt::to_bits(x)); }
inline float __int_as_float(int x) { return ::simt::from_bits<float>(::simt::to_bits(x)); }
inline long long __double_as_longlong(double x) { return ::simt::from_bits<long long>(::simt::to_bits(x)); }
inline double __longlong_as_double(long long x) { return ::simt::from_bits<double>(::simt::to_bits(x)); }
// Rounding-mode arithmetic: the host's IEEE round-to-nearest operations.
inline float __double2float_rn(double x) { return static_cast<float>(x); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
// Fast math: the hardware's approximations, within their documented error (simt.cpp,
// "approximations"): the result of each is the exact one moved by up to the documented
// number of ulps, as the mode says (FASTRANK_SIMT_APPROX or simt_approx() from Python).
inline float __expf(float x) { return ::simt::expf_approx(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return ::simt::fdividef_approx(a, b); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
