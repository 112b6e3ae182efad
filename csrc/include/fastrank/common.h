// fastrank/common.h: the helpers every kernel shares (CPU and CUDA).
//
//  - DType codes (exported to Python by csrc/bindings/constants.h) and dtype dispatch;
//  - the accumulation type of each storage type (float for float/half/bf16, double for double);
//  - loads/stores that convert storage <-> accumulation type;
//  - numerically stable logistic pieces: one exp gives sigma(x), sigma(-x) and sigma'(x);
//  - a vectorisable exp for float on the CPU (plain arithmetic, so `#pragma omp simd`
//    loops turn into AVX code without -ffast-math);
//  - gains and discounts of NDCG.
//
// Kernels are plain functions over raw pointers, sizes, element strides and a stream, taken
// as one parameter struct per kernel (params.h): this header includes no torch and no pybind11.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#if !defined(__CUDACC__) && defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define FR_HD __host__ __device__ __forceinline__
#else
#define FR_HD inline
#endif

namespace fastrank {

enum class DType : int { f32 = 0, f64 = 1, f16 = 2, bf16 = 3 };

inline const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
  }
  return "unknown";
}

// Accumulation type: double stays double, every other storage type accumulates in float.
template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };
template <typename T> using acc_t = typename AccOf<T>::type;

template <typename T> FR_HD acc_t<T> load(T x) { return static_cast<acc_t<T>>(x); }
template <typename T> FR_HD T store(acc_t<T> x) { return static_cast<T>(x); }
#if defined(__CUDACC__)
template <> FR_HD float load<__half>(__half x) { return __half2float(x); }
template <> FR_HD float load<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> FR_HD __half store<__half>(float x) { return __float2half_rn(x); }
template <> FR_HD __nv_bfloat16 store<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
#endif

// CPU kernels take float32 and float64 (Python upcasts half inputs).
#define FASTRANK_DISPATCH_CPU(dt, T, ...)                                               \
  switch (dt) {                                                                         \
    case ::fastrank::DType::f32: { using T = float; __VA_ARGS__; } break;               \
    case ::fastrank::DType::f64: { using T = double; __VA_ARGS__; } break;              \
    default:                                                                            \
      throw std::invalid_argument(std::string("fastrank: CPU kernels take float32 or "  \
                                              "float64, got ") + ::fastrank::dtype_name(dt)); \
  }

#if defined(__CUDACC__)
// CUDA kernels read all four float dtypes and accumulate in acc_t<T>.
#define FASTRANK_DISPATCH_CUDA(dt, T, ...)                                              \
  switch (dt) {                                                                         \
    case ::fastrank::DType::f32: { using T = float; __VA_ARGS__; } break;               \
    case ::fastrank::DType::f64: { using T = double; __VA_ARGS__; } break;              \
    case ::fastrank::DType::f16: { using T = __half; __VA_ARGS__; } break;              \
    case ::fastrank::DType::bf16: { using T = __nv_bfloat16; __VA_ARGS__; } break;      \
    default: return static_cast<int>(cudaErrorInvalidValue);                            \
  }

// The (sim, relevance) types of a graded loss's CUDA kernels: T is sim's storage type, R
// relevance's: T, or acc_t<T> when Python passed relevance in the accumulation type.
template <typename T, typename R> struct Graded {};

// Calls launch(Graded<T, R>{}) for sim's dtype `dt` and relevance's `rel_dt` (the forward of
// smooth-NDCG, Kendall and Kendall SW-HS); an unknown dtype is cudaErrorInvalidValue.
template <class Launch> int dispatch_graded(DType dt, DType rel_dt, Launch&& launch) {
  FASTRANK_DISPATCH_CUDA(dt, T, {
    return rel_dt == dt ? launch(Graded<T, T>{}) : launch(Graded<T, acc_t<T>>{});
  });
  return 0;
}
#endif

// ---- exp(x) for x <= 0 ------------------------------------------------------------
// float on the CPU: Cephes-style expf (Cody-Waite reduction, degree-6 polynomial,
// about 1 ulp), written as straight-line arithmetic so that it vectorises. Below -87
// it returns 0 instead of a denormal (exp(-87) = 1.6e-38, far below anything a loss
// sum sees; denormal arithmetic would slow the whole vector loop down many times).
// float on the GPU: the hardware __expf. double: exp().
FR_HD float exp_nonpos(float x) {
#if defined(__CUDA_ARCH__)
  return __expf(x);
#else
  const bool tiny = x < -87.0f;  // exp < 1.7e-38: return 0 rather than a denormal
  x = tiny ? -87.0f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  union { int32_t i; float f; } scale;  // 2^n built from its exponent bits, n in [-126, 0]
  scale.i = (static_cast<int32_t>(n) + 127) << 23;
  return tiny ? 0.0f : y * scale.f;
#endif
}
FR_HD double exp_nonpos(double x) { return exp(x); }

// ---- log(x) for x >= 1 ---------------------------------------------------------------
// float on the CPU: Cephes-style logf (exponent and mantissa from the bits, mantissa
// folded into [sqrt(1/2), sqrt(2)), degree-8 polynomial; within 1.6 ulp of log over
// [1, 3e6], tested), straight-line
// arithmetic so that per-item loops vectorise (glibc's scalar log1pf costs ~12 ns a call:
// 0.4 ms of a 128 x 128 smooth-NDCG call). Domain: finite x >= 1 (1 + a smooth rank);
// NaN comes back as NaN. Elsewhere: log().
FR_HD float log_ge1(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  union { float f; int32_t i; } u;
  u.f = x;
  float e = static_cast<float>(((u.i >> 23) & 0xff) - 126);  // x = m * 2^e, m in [0.5, 1)
  u.i = (u.i & 0x007fffff) | 0x3f000000;
  float m = u.f;
  const bool low = m < 0.707106781186547524f;
  e = low ? e - 1.0f : e;
  m = low ? m + m - 1.0f : m - 1.0f;  // now x = (1 + m) * 2^e, 1 + m in [sqrt(1/2), sqrt(2))
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y += -2.12194440e-4f * e;
  y += -0.5f * z;
  const float r = (m + y) + 0.693359375f * e;
  return x == x ? r : x;
#endif
}
FR_HD double log_ge1(double x) { return log(x); }

// ---- logistic ----------------------------------------------------------------------
// 1 / (1 + e) for e = exp(-|x|) in [0, 1], so a divisor in [1, 2]. CUDA, float: the hardware
// reciprocal (__fdividef: MUFU.RCP, within 1 ulp on that range; the exp beside it is
// __expf's 2 ulp), not the IEEE division, whose special-case test and slow-path call cut
// every pair loop into branches (nvdisasm: a convergence barrier and no unrolling per pair).
// Elsewhere the division.
FR_HD float recip_1p(float e) {
#if defined(__CUDA_ARCH__)
  return __fdividef(1.0f, 1.0f + e);
#else
  return 1.0f / (1.0f + e);
#endif
}
FR_HD double recip_1p(double e) { return 1.0 / (1.0 + e); }

// ---- the special-function unit, directly (CUDA float) -----------------------------------
// exp2_approx(x) = 2^x as one MUFU.EX2 (PTX ex2.approx.ftz.f32) and rcp_approx(x) = 1 / x as
// one MUFU.RCP (rcp.approx.ftz.f32): no range reduction, no denormal fix-up (__expf adds
// three instructions around its MUFU.EX2 for denormal results, and a multiply by log2(e)).
// Documented errors (CUDA C++ Programming Guide, mathematical functions: exp2f, whose code
// is this instruction, 2 ulp; __fdividef, MUFU.RCP and a multiply, 2 ulp for a divisor in
// [2^-126, 2^126]): denormal inputs and results are flushed to zero. The SIMT emulator
// returns a result perturbed within exactly these bounds (tests/simt, simt::ex2_approx), so
// the emulated matrix checks the accuracy the GPU gives. double, and host code: the
// library functions.
#if defined(__CUDA_ARCH__) && defined(FASTRANK_SIMT)
FR_HD float exp2_approx(float x) { return ::simt::ex2_approx(x); }
FR_HD float rcp_approx(float x) { return ::simt::rcp_approx(x); }
#elif defined(__CUDA_ARCH__)
FR_HD float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
FR_HD float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#else
inline float exp2_approx(float x) { return std::exp2(x); }
inline float rcp_approx(float x) { return 1.0f / x; }
#endif
FR_HD double exp2_approx(double x) { return exp2(x); }
FR_HD double rcp_approx(double x) { return 1.0 / x; }

// For x: e = exp(-|x|) in (0, 1], a = 1 / (1 + e) = sigma(|x|), b = e * a = sigma(-|x|).
// Then sigma(x) and sigma(-x) are a and b in some order, and sigma'(x) = a * b:
// one exp serves both members of a pair (sigma(-x) = 1 - sigma(x)) without the
// cancellation of computing 1 - sigma(x) when sigma(x) is near 1.
template <typename A> struct Logistic {
  A pos;    // sigma(x)
  A neg;    // sigma(-x) = 1 - sigma(x)
  A deriv;  // sigma'(x) = sigma(x) * sigma(-x)
};

template <typename A> FR_HD Logistic<A> logistic(A x) {
  const A e = exp_nonpos(x >= A(0) ? -x : x);
  const A a = recip_1p(e);
  const A b = e * a;
  Logistic<A> l;
  l.pos = x >= A(0) ? a : b;
  l.neg = x >= A(0) ? b : a;
  l.deriv = a * b;
  return l;
}

// The two halves separately (the compiler shares the exp when both are used in one
// loop body); a struct return would block GCC's vectoriser.
template <typename A> FR_HD A logistic_pos(A x) {
  const A e = exp_nonpos(x >= A(0) ? -x : x);
  const A a = recip_1p(e);
  return x >= A(0) ? a : e * a;
}
template <typename A> FR_HD A logistic_neg(A x) {
  const A e = exp_nonpos(x >= A(0) ? -x : x);
  const A a = recip_1p(e);
  return x >= A(0) ? e * a : a;
}

template <typename A> FR_HD A logistic_deriv(A x) {
  const A e = exp_nonpos(x >= A(0) ? -x : x);
  const A a = recip_1p(e);
  return e * a * a;
}

// ---- fused-call conventions -----------------------------------------------------------
// One native loss call computes every requested direction and the reduction itself
// (codes exported to Python by csrc/bindings/constants.h: DIRECTION_CODE, REDUCTION_CODE).
enum Direction : int { kI2T = 1, kT2I = 2, kBoth = 3 };
enum Reduction : int { kNone = 0, kMean = 1, kSum = 2 };
// Which pair pass a list of graded relevance takes (docs/spec.md §2.1b): the cheaper one
// (auto), or one forced (the tests compare them, the benchmarks time them): dense = every
// pair of the list, sparse = the items of nonzero gain against every item.
enum Path : int { kAutoPath = 0, kDensePath = 1, kSparsePath = 2 };
// The one rule of the automatic choice, for the CPU and the CUDA kernels alike (and exported to
// Python): a list of `len` items, `np` of them of nonzero gain (relevance), takes the sparse
// pass when its pair work, np x len (each such item against every item), is below the dense
// pass's, len^2 / 2 (each unordered pair once). A pair costs about the same in either pass on
// either backend (one exp and one reciprocal; Kendall: a compare and a select), so the
// backends' vector and block shapes, which round both sides alike, are left out.
FR_HD bool takes_sparse_pass(int paths, int64_t np, int64_t len) {
  if (paths != kAutoPath) return paths == kSparsePath;
  return 2 * np < len;
}

// ---- NaN propagation (docs/spec.md §1) -------------------------------------------------
// On CUDA no host check runs by default: a NaN or inf in the input must reach the loss
// and the gradient. std::max(NaN, 0) and fmaxf(NaN, 0) return 0, so the kernels use these:
//  - hinge_nan(x) = [x]+ for numbers, NaN for NaN (and for -inf);
//  - max_nan / min_nan: NaN wins (once the running value is NaN it stays NaN);
//  - poison(x): 0 for finite x, NaN for NaN or +-inf. A kernel adds the poison of
//    every value it read but did not otherwise fold into an output, so a non-finite
//    input can never yield a finite result.
// poison is a comparison and a select, not arithmetic: under the CPU flags
// (-fassociative-math -fno-signed-zeros, CMakeLists.txt) GCC 12 folds 0 * x to 0, and
// x - x inside a larger sum can be reassociated away, losing the NaN; comparisons stay.
template <typename A> FR_HD A poison(A x) {
  return (x >= -std::numeric_limits<A>::max() && x <= std::numeric_limits<A>::max())
             ? A(0) : std::numeric_limits<A>::quiet_NaN();
}
template <typename A> FR_HD A hinge_nan(A x) { return x > A(0) ? x : poison(x); }
template <typename A> FR_HD A max_nan(A a, A b) { return (b > a || b != b) ? b : a; }
template <typename A> FR_HD A min_nan(A a, A b) { return (b < a || b != b) ? b : a; }

// ---- NDCG pieces (Listwise ITR, Eq. 17) -------------------------------------------------
// gain g = 2^r - 1; discount f(p) = 1 / log2(1 + p) = ln 2 / ln(1 + p);
// f'(p) = -ln 2 / ((1 + p) * ln(1 + p)^2).
template <typename A> FR_HD A ndcg_gain(A r) { return exp2(r) - A(1); }
template <typename A> FR_HD A ndcg_discount(A p) { return A(0.69314718055994530942) / log1p(p); }
// f(p) and f'(p) from one log, l = ln(1 + p) (the caller's log: log1p on the GPU,
// the vectorisable log_ge1(1 + p) on the CPU).
template <typename A> FR_HD void ndcg_discounts(A p, A l, A* f, A* fd) {
  const A ln2 = A(0.69314718055994530942);
  *f = ln2 / l;
  *fd = -ln2 / ((A(1) + p) * l * l);
}

// ---- small CPU helpers ----------------------------------------------------------------
// Fresh multi-MB outputs from torch.empty are untouched mmap'ed pages: on first write each
// 4 KiB page faults, and on a VM that costs more than computing the values (a 500 MB float
// matrix = 122k faults, ~0.4 s of system time). Before writing a large CPU output, a kernel
// asks Linux for transparent huge pages on its 2 MiB-aligned interior (what PyTorch itself
// does under THP_MEM_ALLOC_ENABLE=1): 512x fewer faults. A hint only: harmless when THP is
// off ("never") or unsupported, a no-op off Linux, and only for buffers of 16 MiB or more.
// FASTRANK_HUGE_PAGES=0 turns it off (where THP compaction stalls are a concern).
inline void advise_huge_pages(void* p, size_t bytes) {
#if !defined(__CUDACC__) && defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  static const bool enabled = [] {
    const char* e = std::getenv("FASTRANK_HUGE_PAGES");
    return !(e != nullptr && e[0] == '0');
  }();
  if (!enabled || p == nullptr || bytes < 8 * kHuge) return;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (e > b) (void)madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

// Copy element j of a strided row into a contiguous buffer (any input strides).
template <typename T>
inline void gather_row(const T* row, int64_t stride, int64_t n, T* out) {
  if (stride == 1) {
    std::memcpy(out, row, sizeof(T) * static_cast<size_t>(n));
  } else {
    for (int64_t j = 0; j < n; ++j) out[j] = row[j * stride];
  }
}

// out[i * os + j] = in[j * is + i] for i < ni, j < nj: a strided block transposed, in blocks of
// 16 j, so that each line of `out` is written whole and the 16 lines of `in` under a block stay
// in cache while i runs (a line, and a page, of `in` visited once per block, not once per i).
// The next block's lines of `in` are prefetched (rows `is` apart: no hardware prefetcher
// follows them across pages). (Blocks of 64 j measured slower at n = m = 4096.)
template <typename T>
inline void transpose_block(const T* in, int64_t is, T* out, int64_t os, int64_t ni, int64_t nj) {
  constexpr int64_t kB = 16, kLine = 64 / sizeof(T);
  for (int64_t j0 = 0; j0 < nj; j0 += kB) {
    const int64_t nb = nj - j0 < kB ? nj - j0 : kB;
#if defined(__GNUC__)
    for (int64_t j = j0 + kB; j < j0 + 2 * kB && j < nj; ++j)
      for (int64_t i = 0; i < ni; i += kLine) __builtin_prefetch(in + j * is + i);
#endif
    for (int64_t i = 0; i < ni; ++i) {
      T* o = out + i * os + j0;
      const T* p = in + j0 * is + i;
      for (int64_t j = 0; j < nb; ++j) o[j] = p[j * is];
    }
  }
}

// Copy rows q0 .. q0 + nt - 1 of a strided (n_q, n_c) view into out[t * n_c + c]. When the
// rows are the view's columns (s_q == 1, the t2i direction), the nt rows are read together
// (transpose_block): nt neighbouring values of a line of the matrix per c instead of one
// line per value and row, with no transposed copy of the matrix (the buffer is nt rows).
template <typename T>
inline void gather_rows(const T* base, int64_t s_q, int64_t s_c, int64_t q0, int64_t nt, int64_t n_c, T* out) {
  if (s_c == 1 || s_q != 1) {
    for (int64_t t = 0; t < nt; ++t) gather_row(base + (q0 + t) * s_q, s_c, n_c, out + t * n_c);
    return;
  }
  transpose_block(base + q0, s_c, out, n_c, nt, n_c);
}

#if defined(__CUDACC__)
// ---- CUDA helpers ------------------------------------------------------------------------
// Butterfly warp reductions (all 32 lanes take part): every lane ends with the same value
// (each step combines the same two operands on both partner lanes; max_nan is symmetric), in
// a fixed order: deterministic.
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename A> __device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Deterministic block sum of one value per thread (fixed tree order, no atomics).
// `scratch` holds blockDim.x values; blockDim.x must be a power of two. Every thread
// returns the block's sum.
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* scratch) {
  const int t = threadIdx.x;
  scratch[t] = v;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (t < w) scratch[t] += scratch[t + w];
    __syncthreads();
  }
  const A total = scratch[0];
  __syncthreads();
  return total;
}

// One direction's share of a smooth-rank call's reduction (one block; smooth_ndcg.cu,
// smooth_rank.cuh): the per-thread sums of the direction's query losses and of its queries
// that count are summed over the block; thread 0 records the count (ws's count_d,
// params.h) and adds the direction's share to `total` (mean: sum / count, 0 without a
// query; sum: sum).
template <typename A>
__device__ __forceinline__ void add_direction(A sum, A cnt, int reduction, A* scratch, A* count_out, A& total) {
  sum = block_sum(sum, scratch);
  cnt = block_sum(cnt, scratch);
  if (threadIdx.x == 0) {
    *count_out = cnt;
    if (reduction == kMean) total += cnt > A(0) ? sum / cnt : A(0);
    if (reduction == kSum) total += sum;
  }
}
#endif

}  // namespace fastrank
