// The dense baseline of the training benchmark: a gated FFN forward + backward in five BLAS GEMMs
// and two elementwise passes, laid out so that one GEMM serves both first-layer weights.
//
//   W1 = [Wg; Wu]  [2N, K]   (the bench's own concatenated copy; twell's plan views its halves)
//   forward:  GU  = x W1^T                      [M, 2N]  = [G | U]         (GEMM gate_up)
//             G  <- relu(G) in place; h = relu(G) * U   [M, N]            (elementwise forward)
//             y   = h Wd                        [M, K]   (Wd neuron-major [N, K])  (GEMM down)
//   saved for backward: GU = [relu(G) | U] (2 M N elements); h is recomputed, not kept.
//   backward: D[:, :N] = dh = dy Wd^T           [M, N], leading dimension 2N       (GEMM dh)
//             t = dh + l1 sign(h) / M;  D = [dg | du] = [t U [G > 0] | t relu(G)], in place;
//             h recomputed from GU into its [M, N] buffer for dWd         (elementwise backward)
//             dx  = D W1                        [M, K]   (depth 2N: dg Wg + du Wu) (GEMM dx)
//             dW1 = D^T x                       [2N, K] f32 = [dWg; dWu]           (GEMM dw1)
//             dWd = h^T dy                      [N, K]  f32                        (GEMM dwd)
// Every matrix is row-major. The GEMMs are described once, row-major, and mapped to one
// column-major call (cuBLAS's and CBLAS ColMajor's convention) by map_row_major: the CPU runner
// runs the very same calls through cblas_sgemm(CblasColMajor, ...), so a CPU run checks the mapping
// the CUDA runner hands to cublasGemmEx against twell's (oracle-tested) CPU training plan.
#pragma once
#include <cstddef>
#include <cstdint>

#include "twell/dtype.hpp"

#if defined(__CUDACC__)
#define TWELL_BENCH_HD __host__ __device__
#else
#define TWELL_BENCH_HD
#endif

namespace twell::bench {

// A row-major matrix in one buffer: rows x cols, leading dimension ld (elements), `bytes` the size
// of the buffer from `data` on (checked against the last element the matrix reaches).
struct RowMajor {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0, ld = 0;
  size_t bytes = 0;
};

// One column-major GEMM, C = op_a(A) op_b(B) with C m x n, in BLAS argument order.
struct ColMajorGemm {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int lda = 0;
  DType a_type = DType::f32;
  const void* b = nullptr;
  int ldb = 0;
  DType b_type = DType::f32;
  void* c = nullptr;
  int ldc = 0;
  DType c_type = DType::f32;
};

// Row-major C = op(A) op(B) (op = transpose where trans_*) as one column-major call. Throws
// twell::Error when the shapes do not chain, a leading dimension is below its row width, a buffer
// is smaller than its matrix, a size does not fit a BLAS int, or the types are not {A = B, C = A or
// f32}.
ColMajorGemm map_row_major(const RowMajor& a, bool trans_a, const RowMajor& b, bool trans_b,
                           const RowMajor& c);

// The buffers of the dense step (device or host). dtype: x, dy, y, dx, W1, Wd, GU, D and h;
// dw1 and dwd are f32.
struct DenseStepBuffers {
  int64_t m = 0, k = 0, n = 0;
  DType dtype = DType::f32;
  const void *x = nullptr, *dy = nullptr, *w1 = nullptr, *wd = nullptr;
  void *y = nullptr, *dx = nullptr, *dw1 = nullptr, *dwd = nullptr;
  void *gu = nullptr, *d = nullptr, *h = nullptr;
  // Element counts: x, dy, y, dx: M K; w1: 2 N K; wd: N K; gu, d: 2 M N; h: M N; dw1: 2 N K;
  // dwd: N K. Buffer sizes, checked by map_row_major, are these times the element size.
};

enum class DenseGemm : uint8_t { gate_up, down, dh, dx, dw1, dwd };
ColMajorGemm dense_gemm(DenseGemm which, const DenseStepBuffers& b);

// The elementwise math, shared by the CUDA kernels and the CPU loops. `round` is the storage
// rounding of the dtype (identity for f32), applied where the dense layer stores a value.
//   forward:  gr = relu(g); h = round(gr * u)
//   backward: h = round(gr * u) (recomputed as forward stored it); t = dh + l1_over_m * sign(h);
//             dg = gr > 0 ? t * u : 0 (gr > 0 exactly where G > 0); du = t * gr
TWELL_BENCH_HD inline float dense_relu(float g) { return g > 0.0f ? g : 0.0f; }
TWELL_BENCH_HD inline void dense_backward_element(float dh, float gr, float u, float h, float l1_over_m,
                                                  float& dg, float& du) {
  const float t = dh + l1_over_m * float((h > 0.0f) - (h < 0.0f));
  dg = gr > 0.0f ? t * u : 0.0f;
  du = t * gr;
}

}  // namespace twell::bench
