// The SIMT emulator's own tests: deliberately broken kernels, each of which a GPU run would
// expose (a hang, a launch error, garbage or a crash), and correct controls. Compiled only
// for the emulator (build.py: build_selftest); tests/test_emulated.py runs each by name
// through simt_selftest_run() and checks that the emulator reports it.
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "fastrank/common.h"
#include "fastrank/launch.h"

namespace selftest {
namespace {

using fastrank::cuda::launch;
constexpr int kThreads = 128;

// ---- the special-function unit's approximations ------------------------------------------------
// out[0, 128): 2^(i - 64) by exp2_approx, out[128, 256): 1 / (i - 127.5) by rcp_approx (common.h,
// the kernels' helpers), out[256, 384): a kernel that relies on exactness: 2^k by
// exp2_approx, truncated to an integer, is 2^k only if the exp is exact (or rounds up).
__global__ void __launch_bounds__(kThreads) special_functions(float* out) {
  const int i = threadIdx.x;
  out[i] = fastrank::exp2_approx(static_cast<float>(i - 64));
  out[128 + i] = fastrank::rcp_approx(static_cast<float>(i) - 127.5f);
  const int k = i % 24;
  out[256 + i] = static_cast<float>(static_cast<int>(fastrank::exp2_approx(static_cast<float>(k))) == (1 << k));
}

// ---- correct controls ----------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) neighbour_sum(float* out) {
  __shared__ float buf[kThreads];
  buf[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = buf[threadIdx.x] + buf[(threadIdx.x + 1) % kThreads];
}

// Every shuffle flavour with a segment width of 8, and the votes (checked against Python).
__global__ void __launch_bounds__(64) shuffles(float* out) {
  const int t = threadIdx.x;
  const float v = static_cast<float>(t);
  float* o = out + 8 * t;
  o[0] = __shfl_sync(0xffffffffu, v, 3, 8);
  o[1] = __shfl_up_sync(0xffffffffu, v, 2, 8);
  o[2] = __shfl_down_sync(0xffffffffu, v, 2, 8);
  o[3] = __shfl_xor_sync(0xffffffffu, v, 9, 8);
  o[4] = __shfl_xor_sync(0xffffffffu, v, 1);
  o[5] = static_cast<float>(__ballot_sync(0xffffffffu, t % 3 == 0));
  o[6] = static_cast<float>(__syncthreads_count(t % 5 == 0));
  float s = v;  // butterfly sum over the warp
  for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
  o[7] = s;
}

// Lanes 0-15 and 16-31 shuffle in two groups with complementary masks: legal.
__global__ void __launch_bounds__(32) split_warp(float* out) {
  const int t = threadIdx.x;
  const unsigned mask = t < 16 ? 0x0000ffffu : 0xffff0000u;
  out[t] = __shfl_xor_sync(mask, static_cast<float>(t), 1);
}

// ---- broken kernels ------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) early_return_before_barrier(float* out) {
  if (threadIdx.x == 5) return;  // BUG: leaves before a barrier the others wait at
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void __launch_bounds__(kThreads) different_barriers(float* out) {
  if (threadIdx.x < 64) {
    __syncthreads();  // BUG: half the block waits here...
  } else {
    __syncthreads();  // ...and half here
  }
  out[threadIdx.x] = 1.0f;
}

__global__ void __launch_bounds__(kThreads) bounded(float* out) { out[threadIdx.x] = 1.0f; }

__global__ void __launch_bounds__(1024) any_shape(float* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) out[0] = 1.0f;
}

__global__ void __launch_bounds__(kThreads) too_much_shared(float* out) {
  __shared__ float big[13 * 1024];  // BUG: 52 KiB of static shared memory
  big[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = big[(threadIdx.x + 1) % kThreads];
}

__global__ void __launch_bounds__(kThreads) unwritten_shared(float* out) {
  __shared__ float buf[kThreads];
  if (threadIdx.x > 0) buf[threadIdx.x] = 1.0f;  // BUG: nobody writes buf[0]
  __syncthreads();
  out[threadIdx.x] = buf[(threadIdx.x + 1) % kThreads];
}

__global__ void __launch_bounds__(kThreads) missing_barrier(float* out) {
  __shared__ float buf[kThreads];
  buf[threadIdx.x] = static_cast<float>(threadIdx.x);
  // BUG: no __syncthreads() before reading a neighbour's value
  out[threadIdx.x] = buf[(threadIdx.x + 1) % kThreads];
}

__global__ void __launch_bounds__(kThreads) global_overflow(float* out, int n) {
  (void)n;  // BUG: no `if (threadIdx.x < n)`
  out[threadIdx.x] = 1.0f;
}

__global__ void __launch_bounds__(kThreads) shared_index_overflow(float* out) {
  __shared__ float buf[kThreads];
  buf[threadIdx.x + 1] = 1.0f;  // BUG: thread 127 writes buf[128]
  __syncthreads();
  out[threadIdx.x] = buf[threadIdx.x];
}

__device__ void fill(float* p, int i) { p[i] = 1.0f; }

__global__ void __launch_bounds__(kThreads) shared_pointer_overflow(float* out) {
  __shared__ float buf[kThreads];
  __shared__ float after[kThreads];
  fill(buf, threadIdx.x + kThreads);  // BUG: past buf through a pointer, where no index is checked
  after[threadIdx.x] = 0.0f;
  __syncthreads();
  out[threadIdx.x] = buf[threadIdx.x] + after[threadIdx.x];
}

__global__ void __launch_bounds__(64) shuffle_after_return(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x == 3) return;  // BUG: lane 3 leaves, but the mask names it
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

__global__ void __launch_bounds__(32) shuffle_mask_without_own_lane(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, static_cast<float>(threadIdx.x), 1);  // BUG: lanes 16-31
}

// ---- the driver ----------------------------------------------------------------------------------
struct Case {
  const char* name;
  int (*run)(float* out, int n);
};

const Case kCases[] = {
    {"neighbour_sum", [](float* o, int) { return launch(neighbour_sum, 1, kThreads, 0, nullptr, o); }},
    {"special_functions", [](float* o, int) { return launch(special_functions, 1, kThreads, 0, nullptr, o); }},
    {"shuffles", [](float* o, int) { return launch(shuffles, 1, 64, 0, nullptr, o); }},
    {"split_warp", [](float* o, int) { return launch(split_warp, 1, 32, 0, nullptr, o); }},
    {"early_return_before_barrier",
     [](float* o, int) { return launch(early_return_before_barrier, 1, kThreads, 0, nullptr, o); }},
    {"different_barriers", [](float* o, int) { return launch(different_barriers, 1, kThreads, 0, nullptr, o); }},
    {"block_over_launch_bounds", [](float* o, int) { return launch(bounded, 1, 2 * kThreads, 0, nullptr, o); }},
    {"block_over_1024", [](float* o, int) { return launch(any_shape, 1, dim3(64, 32), 0, nullptr, o); }},
    {"grid_y_over_65535", [](float* o, int) { return launch(any_shape, dim3(1, 65536), 32, 0, nullptr, o); }},
    {"grid_z_over_65535", [](float* o, int) { return launch(any_shape, dim3(1, 1, 65536), 32, 0, nullptr, o); }},
    {"grid_y_65535", [](float* o, int) { return launch(any_shape, dim3(1, 65535), 1, 0, nullptr, o); }},
    {"static_shared_over_48k", [](float* o, int) { return launch(too_much_shared, 1, kThreads, 0, nullptr, o); }},
    {"unwritten_shared", [](float* o, int) { return launch(unwritten_shared, 1, kThreads, 0, nullptr, o); }},
    {"missing_barrier", [](float* o, int) { return launch(missing_barrier, 1, kThreads, 0, nullptr, o); }},
    {"global_overflow", [](float* o, int n) {
       // a buffer of n < 128 floats of its own, so that the overflow lands on a heap redzone
       std::vector<float> small(static_cast<size_t>(n));
       const int e = launch(global_overflow, 1, kThreads, 0, nullptr, small.data(), n);
       std::memcpy(o, small.data(), sizeof(float) * static_cast<size_t>(n));
       return e;
     }},
    {"shared_index_overflow", [](float* o, int) { return launch(shared_index_overflow, 1, kThreads, 0, nullptr, o); }},
    {"shared_pointer_overflow",
     [](float* o, int) { return launch(shared_pointer_overflow, 1, kThreads, 0, nullptr, o); }},
    {"shuffle_after_return", [](float* o, int) { return launch(shuffle_after_return, 1, 64, 0, nullptr, o); }},
    {"shuffle_mask_without_own_lane",
     [](float* o, int) { return launch(shuffle_mask_without_own_lane, 1, 32, 0, nullptr, o); }},
};

}  // namespace
}  // namespace selftest

extern "C" {
// Runs case `name` into out (at least 512 floats; n: the size a case may use). Returns the
// launch's cudaError_t (0 = success), or -1 for an unknown name.
__attribute__((visibility("default"))) int simt_selftest_run(const char* name, float* out, int n) {
  for (const auto& c : selftest::kCases)
    if (std::strcmp(c.name, name) == 0) return c.run(out, n);
  return -1;
}
__attribute__((visibility("default"))) const char* simt_selftest_error(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}
}
