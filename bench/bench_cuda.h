// The CUDA micro-benchmarks' error check (bench_launch.cu, bench_phases.cu): a failed runtime call
// prints the program, the call, its line and CUDA's error, and exits 1.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#ifndef BENCH_NAME
#error "define BENCH_NAME (the program's name, for messages) before including bench_cuda.h"
#endif

[[noreturn]] inline void cuda_fail(cudaError_t err, const char* what, int line) {
  std::fprintf(stderr, "%s: %s failed (line %d): %s (%s)\n", BENCH_NAME, what, line, cudaGetErrorString(err),
               cudaGetErrorName(err));
  std::exit(1);
}

#define CHECK_CUDA(call)                                       \
  do {                                                         \
    const cudaError_t err_ = (call);                           \
    if (err_ != cudaSuccess) cuda_fail(err_, #call, __LINE__); \
  } while (0)
