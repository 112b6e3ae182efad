// CUDA runtime queries for the CUDA module (csrc/cuda/runtime.cu). No CUDA headers here,
// so the bindings compile with the host compiler alone.
#pragma once

namespace fastrank {
namespace cuda {
int device_count();               // 0 when no device or no driver (never throws)
int runtime_version();            // e.g. 13000
const char* error_string(int code);
int synchronize();                // cudaDeviceSynchronize, for tests and benchmarks
}  // namespace cuda
}  // namespace fastrank
