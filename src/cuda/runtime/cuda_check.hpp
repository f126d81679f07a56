// Every CUDA runtime and cuBLASLt status becomes a twell::Error (op, argument, expected, actual);
// the CUDA backend never exits or aborts.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "twell/error.hpp"

namespace twell::gpu {

// Throws Error(op, what, "cudaSuccess", "<error name>: <description>") unless status is success.
inline void check_cuda(cudaError_t status, const char* op, const char* what) {
  if (status == cudaSuccess) return;
  throw Error(op, what, "cudaSuccess",
              std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status));
}

inline void check_cublas(cublasStatus_t status, const char* op, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(op, what, "CUBLAS_STATUS_SUCCESS", cublasLtGetStatusString(status));
}

// After a kernel launch: a bad configuration (or an earlier asynchronous fault) surfaces here.
inline void check_launch(const char* op, const char* kernel) {
  check_cuda(cudaGetLastError(), op, kernel);
}

}  // namespace twell::gpu
