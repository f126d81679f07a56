#include "training_dense.hpp"

#include <climits>
#include <string>

#include "twell/error.hpp"

namespace twell::bench {

namespace {

constexpr const char* kOp = "bench dense training GEMM";

std::string dims(int64_t r, int64_t c) { return std::to_string(r) + " x " + std::to_string(c); }

int as_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) throw Error(kOp, what, "0..INT_MAX (a BLAS int)", std::to_string(v));
  return int(v);
}

void check_operand(const RowMajor& t, const char* what) {
  if (!t.data) throw Error(kOp, what, "a buffer", "null");
  if (t.rows < 1 || t.cols < 1) throw Error(kOp, what, "a non-empty matrix", dims(t.rows, t.cols));
  if (t.ld < t.cols)
    throw Error(kOp, what, "leading dimension >= " + std::to_string(t.cols), std::to_string(t.ld));
  const size_t need = (size_t(t.rows - 1) * size_t(t.ld) + size_t(t.cols)) * dtype_size(t.dtype);
  if (t.bytes < need)
    throw Error(kOp, what, ">= " + std::to_string(need) + " bytes for " + dims(t.rows, t.cols) +
                               " (ld " + std::to_string(t.ld) + ")",
                std::to_string(t.bytes) + " bytes");
}

}  // namespace

// cuBLAS (and CBLAS ColMajor) read a buffer column-major: the buffer of a row-major R x C matrix
// with leading dimension ld, read column-major with the same ld, is its transpose (C x R). So the
// row-major product C = op(A) op(B) is, on the same buffers, the column-major product
// C^T = op(B)^T op(A)^T, and:
//   * B's buffer goes first. Read column-major it holds B^T: op(B)^T is that buffer as it is when
//     op(B) = B (flag N), and its transpose when op(B) = B^T (flag T). So the first operand's flag
//     is trans_b; likewise the second operand is A's buffer with flag trans_a.
//   * m = C.cols, n = C.rows (C^T is C.cols x C.rows), k = the shared depth; ldc = C.ld.
//   * Leading dimensions pass through unchanged (lda of the call = B.ld, ldb = A.ld). BLAS asks
//     lda >= m with flag N (B is row-major k x m there: B.ld >= B.cols = m) and lda >= k with T
//     (B is row-major m x k: B.ld >= k); check_operand's ld >= cols is exactly that.
// Example, the gate GEMM of testing/cuda_runner.cpp: G[M, N] = x[M, K] W[N, K]^T maps to
// (T, N, m = N, n = M, k = K, W, ld K, x, ld K, G, ld N).
ColMajorGemm map_row_major(const RowMajor& a, bool trans_a, const RowMajor& b, bool trans_b,
                           const RowMajor& c) {
  check_operand(a, "A");
  check_operand(b, "B");
  check_operand(c, "C");
  const int64_t a_rows = trans_a ? a.cols : a.rows, a_cols = trans_a ? a.rows : a.cols;  // op(A)
  const int64_t b_rows = trans_b ? b.cols : b.rows, b_cols = trans_b ? b.rows : b.cols;  // op(B)
  if (a_cols != b_rows)
    throw Error(kOp, "depth", "op(A) cols == op(B) rows",
                dims(a_rows, a_cols) + " times " + dims(b_rows, b_cols));
  if (c.rows != a_rows || c.cols != b_cols)
    throw Error(kOp, "C", dims(a_rows, b_cols), dims(c.rows, c.cols));
  if (a.dtype != b.dtype) throw Error(kOp, "B dtype", dtype_name(a.dtype), dtype_name(b.dtype));
  if (c.dtype != a.dtype && c.dtype != DType::f32)
    throw Error(kOp, "C dtype", std::string(dtype_name(a.dtype)) + " or float32", dtype_name(c.dtype));
  ColMajorGemm g;
  g.trans_a = trans_b;
  g.trans_b = trans_a;
  g.m = as_int(c.cols, "m");
  g.n = as_int(c.rows, "n");
  g.k = as_int(a_cols, "k");
  g.a = b.data;
  g.lda = as_int(b.ld, "lda");
  g.a_type = b.dtype;
  g.b = a.data;
  g.ldb = as_int(a.ld, "ldb");
  g.b_type = a.dtype;
  g.c = const_cast<void*>(c.data);
  g.ldc = as_int(c.ld, "ldc");
  g.c_type = c.dtype;
  return g;
}

ColMajorGemm dense_gemm(DenseGemm which, const DenseStepBuffers& b) {
  const int64_t m = b.m, k = b.k, n = b.n;
  const size_t es = dtype_size(b.dtype), fs = sizeof(float);
  const DType t = b.dtype;
  // Whole buffers, row-major with their natural leading dimension.
  const RowMajor x{b.x, t, m, k, k, size_t(m * k) * es};
  const RowMajor dy{b.dy, t, m, k, k, size_t(m * k) * es};
  const RowMajor y{b.y, t, m, k, k, size_t(m * k) * es};
  const RowMajor dx{b.dx, t, m, k, k, size_t(m * k) * es};
  const RowMajor w1{b.w1, t, 2 * n, k, k, size_t(2 * n * k) * es};
  const RowMajor wd{b.wd, t, n, k, k, size_t(n * k) * es};
  const RowMajor gu{b.gu, t, m, 2 * n, 2 * n, size_t(2 * m * n) * es};
  const RowMajor d{b.d, t, m, 2 * n, 2 * n, size_t(2 * m * n) * es};
  const RowMajor dh{b.d, t, m, n, 2 * n, size_t(2 * m * n) * es};  // D's left half
  const RowMajor h{b.h, t, m, n, n, size_t(m * n) * es};
  const RowMajor dw1{b.dw1, DType::f32, 2 * n, k, k, size_t(2 * n * k) * fs};
  const RowMajor dwd{b.dwd, DType::f32, n, k, k, size_t(n * k) * fs};
  switch (which) {
    case DenseGemm::gate_up: return map_row_major(x, false, w1, true, gu);  // [M,K] [2N,K]^T
    case DenseGemm::down: return map_row_major(h, false, wd, false, y);     // [M,N] [N,K]
    case DenseGemm::dh: return map_row_major(dy, false, wd, true, dh);      // [M,K] [N,K]^T
    case DenseGemm::dx: return map_row_major(d, false, w1, false, dx);      // [M,2N] [2N,K]
    case DenseGemm::dw1: return map_row_major(d, true, x, false, dw1);      // [M,2N]^T [M,K]
    case DenseGemm::dwd: return map_row_major(h, true, dy, false, dwd);     // [M,N]^T [M,K]
  }
  throw Error(kOp, "which", "a DenseGemm", std::to_string(int(which)));
}

}  // namespace twell::bench
