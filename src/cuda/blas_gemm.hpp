// Weight-gradient GEMMs of training's dense path through cuBLAS: dw [n, k] (f32, row-major) =
// a^T b with a [rows, n] (leading dimension lda) and b [rows, k] (16-bit, row-major), fp32
// accumulation. Row-major dw^T = b^T a is the column-major product [k, rows] x [rows, n]: b's
// buffer is column-major [k, rows] (op N), a's is column-major [n, rows] (op T).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "twell/dtype.hpp"

namespace twell::gpu {

class BlasWeightGrad {
 public:
  explicit BlasWeightGrad(DType dtype);
  ~BlasWeightGrad();
  BlasWeightGrad(const BlasWeightGrad&) = delete;
  BlasWeightGrad& operator=(const BlasWeightGrad&) = delete;

  // Enqueues the product on s, using `workspace` (workspace_bytes) as cuBLAS's scratch.
  void run(const void* a, int64_t lda, const void* b, int64_t rows, int64_t n, int64_t k, float* dw,
           cudaStream_t s, void* workspace, size_t workspace_bytes);

 private:
  cudaDataType_t type_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace twell::gpu
