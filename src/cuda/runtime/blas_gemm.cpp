#include "cuda/runtime/blas_gemm.hpp"

#include <limits>
#include <string>

#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

constexpr const char* kOp = "TrainingPlan::backward";

int blas_int(int64_t v, const char* what) {
  if (v > std::numeric_limits<int>::max())
    throw Error(kOp, what, "at most 2147483647 for cuBLAS", std::to_string(v));
  return int(v);
}

}  // namespace

BlasGemm::BlasGemm(DType dtype) : type_(dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F) {
  check_cublas(cublasCreate(&handle_), "TrainingPlan", "cuBLAS handle");
}

BlasGemm::~BlasGemm() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

void BlasGemm::gemm(cublasOperation_t op_second, int64_t k, int64_t cols, int64_t depth, const void* first,
                    const void* second, int64_t ld_second, float* out, float beta, cudaStream_t s,
                    void* workspace, size_t workspace_bytes, const char* what) {
  check_cublas(cublasSetStream(handle_, s), kOp, "cuBLAS stream");
  check_cublas(cublasSetWorkspace(handle_, workspace, workspace_bytes), kOp, "cuBLAS workspace");
  const float alpha = 1.0f;
  check_cublas(cublasGemmEx(handle_, CUBLAS_OP_N, op_second, blas_int(k, "K"), blas_int(cols, "columns"),
                            blas_int(depth, "depth"), &alpha, first, type_, blas_int(k, "K"), second, type_,
                            blas_int(ld_second, "leading dimension"), &beta, out, CUDA_R_32F, blas_int(k, "K"),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               kOp, what);
}

void BlasGemm::weight_grad(const void* a, int64_t lda, const void* b, int64_t rows, int64_t n, int64_t k,
                           float* dw, float beta, cudaStream_t s, void* workspace, size_t workspace_bytes) {
  gemm(CUBLAS_OP_T, k, n, rows, b, a, lda, dw, beta, s, workspace, workspace_bytes, "cuBLAS weight-gradient GEMM");
}

void BlasGemm::matmul(const void* a, int64_t lda, const void* w, int64_t rows, int64_t n, int64_t k, float* d,
                      float beta, cudaStream_t s, void* workspace, size_t workspace_bytes) {
  gemm(CUBLAS_OP_N, k, rows, n, w, a, lda, d, beta, s, workspace, workspace_bytes, "cuBLAS matmul");
}

}  // namespace twell::gpu
