// CUDA runtime queries used by the CUDA module's bindings (see runtime.h).
#include <cuda_runtime.h>

#include "fastrank/launch.h"
#include "fastrank/runtime.h"

namespace fastrank {
namespace cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

int runtime_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return v;
}

const char* error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int synchronize() { return static_cast<int>(cudaDeviceSynchronize()); }

}  // namespace cuda
}  // namespace fastrank
