// GEMMs with fp32 output through cuBLAS (16-bit operands, fp32 accumulation), described row-major:
//   weight_grad: dw [n, k] = beta dw + a^T b, a [rows, n] (leading dimension lda), b [rows, k].
//     Row-major dw^T = b^T a is the column-major product [k, rows] x [rows, n]: b's buffer is
//     column-major [k, rows] (op N), a's is column-major [n, rows] (op T).
//   matmul: d [rows, k] = beta d + a w, a [rows, n] (lda), w [n, k] (a neuron-major weight).
//     Row-major d^T = w^T a^T: w's buffer is column-major [k, n] (op N), a's [n, rows] (op N).
// Training's dense path (weight gradients) and its routed rows' share (routed_blas.cu).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/runtime/no_copy.hpp"
#include "twell/dtype.hpp"

namespace twell::gpu {

class BlasGemm : NoCopy {
 public:
  explicit BlasGemm(DType dtype);
  ~BlasGemm();

  // Enqueue the product on s, using `workspace` (workspace_bytes) as cuBLAS's scratch.
  void weight_grad(const void* a, int64_t lda, const void* b, int64_t rows, int64_t n, int64_t k, float* dw,
                   float beta, cudaStream_t s, void* workspace, size_t workspace_bytes);
  void matmul(const void* a, int64_t lda, const void* w, int64_t rows, int64_t n, int64_t k, float* d,
              float beta, cudaStream_t s, void* workspace, size_t workspace_bytes);

 private:
  // Column-major out [k, cols] = beta out + first [k, depth] (ld k) x op(second) (ld ld_second).
  void gemm(cublasOperation_t op_second, int64_t k, int64_t cols, int64_t depth, const void* first,
            const void* second, int64_t ld_second, float* out, float beta, cudaStream_t s, void* workspace,
            size_t workspace_bytes, const char* what);
  cudaDataType_t type_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace twell::gpu
