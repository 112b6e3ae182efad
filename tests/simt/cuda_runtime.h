// cuda_runtime.h for the SIMT emulator (tests/simt/simt.h): force-included first into every
// csrc/cuda/*.cu file when tests/simt/build.py compiles it with the host compiler, and found
// before the toolkit's own header on the include path.
//
// Order matters: the toolkit's real cuda_fp16.h / cuda_bf16.h are included while
// __CUDACC__ is still undefined, so they take their host paths (their conversions are
// plain C++ there); then __CUDACC__ and __CUDA_ARCH__ are defined, so every `#if
// defined(__CUDA_ARCH__)` in fastrank's headers takes the device path, the one nvcc runs
// on the GPU.
#pragma once

#include <math.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <driver_types.h>
#include <vector_types.h>

#ifndef __CUDACC__
#define __CUDACC__ 1
#endif
#ifndef __CUDA_ARCH__
#define __CUDA_ARCH__ 900
#endif

#include "simt.h"

// ---- the runtime API the kernels' entry points call -----------------------------------------
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaRuntimeGetVersion(int* version);
cudaError_t cudaDeviceSynchronize();
