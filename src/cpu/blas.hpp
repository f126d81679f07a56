// Row-major fp32 GEMM wrappers over CBLAS (OpenBLAS), named by the transposes the FFN needs.
#pragma once
#include <cblas.h>

#include <cstdint>
#include <string>

#include "twell/error.hpp"

namespace twell::cpu {

// CBLAS takes int sizes: one past INT32_MAX is an error, never a truncation.
inline int blas_int(int64_t v, const char* what) {
  if (v > INT32_MAX) throw Error("cpu gemm", what, "at most 2147483647", std::to_string(v));
  return int(v);
}

// Whether a BLAS call made inside an OpenMP parallel region runs on the calling thread alone:
// OpenBLAS's OpenMP build (openblas_get_parallel() 2) and a sequential one (0) do; its pthread
// build (1) would start its own threads from every caller.
inline bool blas_in_parallel_is_serial() { return openblas_get_parallel() != 1; }

// One row (a decoding step) goes through sgemv: sgemm would pack all of b before reading it.
// c[m, n] = a[m, k] * b[n, k]^T   (+ beta * c); c's rows ldc apart (0: n)
inline void gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
                    float beta = 0.0f, int64_t ldc = 0) {
  if (m == 0 || n == 0) return;
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, blas_int(n, "columns"), blas_int(k, "depth"), 1.0f, b,
                int(k), a, 1, beta, c, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(m, "rows"), blas_int(n, "columns"),
              blas_int(k, "depth"), 1.0f, a, int(k), b, int(k), beta, c,
              blas_int(ldc > 0 ? ldc : n, "output stride"));
}

// c[m, k] = a[m, n] * b[n, k]   (+ beta * c)
inline void gemm_nn(int64_t m, int64_t k, int64_t n, const float* a, const float* b, float* c,
                    float beta = 0.0f) {
  if (m == 0 || k == 0) return;
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasTrans, blas_int(n, "depth"), blas_int(k, "columns"), 1.0f, b,
                int(k), a, 1, beta, c, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(m, "rows"), blas_int(k, "columns"),
              blas_int(n, "depth"), 1.0f, a, int(n), b, int(k), beta, c, int(k));
}

// c[n, k] += a[m, n]^T * b[m, k]
inline void gemm_tn_acc(int64_t n, int64_t k, int64_t m, const float* a, const float* b, float* c) {
  if (m == 0 || n == 0 || k == 0) return;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(n, "rows"), blas_int(k, "columns"),
              blas_int(m, "depth"), 1.0f, a, int(n), b, int(k), 1.0f, c, int(k));
}

}  // namespace twell::cpu
