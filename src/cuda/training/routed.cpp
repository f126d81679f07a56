// Backward's routed rows: their dense gradients, recomputed from x and dy and added to the compact
// rows' ones. The first C rows (Determinism::fast; C learned from earlier steps) go through
// cuBLAS(Lt) from gathered rows; the rest through twell's tensor-core kernels over the routed list,
// in chunks of p and q's rows (chunk j takes the rows [j chunk_rows, (j + 1) chunk_rows), the
// first of them from row C). Per chunk:
//   g = relu(x W1^T) -> p;  gated: u = x Wu^T -> q[:, :N];  dh = dy Wd^T -> q[:, N:] (plain: q)
//   -> elementwise: dg, du into q, h into p -> dx rows = [dg | du] [W1; Wu]
//   -> dW1 += dg^T x;  gated: dWu += du^T x;  dWd += h^T dy
// cuBLAS's rows first, then the kernels' chunk by chunk: a fixed order.
#include "cuda/policy/config.hpp"
#include "cuda/training/backend.hpp"

namespace twell::gpu::training {

void CudaTraining::backward_routed(const void* x, const void* dy, const Grads& g, const RoutedBuffers& b,
                                   int64_t rows, const L1Coef& l1, cudaStream_t s) {
  const bool gated = dims_.kind == FfnKind::gated;
  const int64_t n = dims_.n, k = dims_.k, c = b.blas_rows;
  const int64_t q_cols = gated ? 2 * n : n;
  const size_t es = dtype_size(dims_.dtype);
  const size_t ws = LtConfig::kWorkspaceBytes;  // b.lt's bytes
  char* q_second = b.q + size_t(n) * es;         // gated: columns N .. 2N-1 of q
  const RowList list{b.order, b.count, c};
  char* x_rows = b.blas;
  char* dy_rows = x_rows + size_t(c * k) * es;
  auto* dx_rows = reinterpret_cast<float*>(dy_rows + size_t(c * k) * es);

  // Rows order[0 .. C) through cuBLAS, from gathered x and dy rows (zero past R), into rows 0 .. C
  // of p and q; their elementwise pass runs with the first chunk's.
  if (c > 0) {
    launch_gather_rows(x, k, list, x_rows, device_, s, kBackwardOp);
    launch_gather_rows(dy, k, list, dy_rows, device_, s, kBackwardOp);
    lt_->run(linear_call(GemmId::gate, c, n, k, x_rows, first_weight(), b.p), s, b.lt);
    GemmCall call = linear_call(GemmId::up, c, n, k, x_rows, weights_.up.data, b.q);
    call.ldd = q_cols;
    if (gated) lt_->run(call, s, b.lt);
    call = linear_call(GemmId::grad_hidden, c, n, k, dy_rows, weights_.down.data, gated ? q_second : b.q);
    call.ldd = q_cols;
    lt_->run(call, s, b.lt);
  }
  for (int64_t start = 0; start < rows; start += b.chunk_rows) {
    const RoutedChunk chunk{start, start + b.chunk_rows};
    const int64_t first = start == 0 ? c : start;  // the kernels' first row of this chunk
    if (start > 0 || c == 0) {
      routed_chunk(x, dy, g, b, rows, l1, chunk, first, s);
      continue;
    }
    // The first chunk with cuBLAS's rows: its recompute and elementwise pass, then cuBLAS's dx
    // rows and weight gradients, then the kernels' (routed_chunk's order, split around them).
    routed_chunk(x, dy, g, b, rows, l1, chunk, first, s, ChunkPart::hidden);
    blas_->matmul(b.q, q_cols, first_weight(), c, n, k, dx_rows, 0.0f, s, b.lt, ws);
    if (gated) blas_->matmul(q_second, q_cols, weights_.up.data, c, n, k, dx_rows, 1.0f, s, b.lt, ws);
    launch_scatter_rows(dims_.dtype, dx_rows, true, k, list, g.dx, device_, s, kBackwardOp);
    routed_chunk(x, dy, g, b, rows, l1, chunk, first, s, ChunkPart::input_grad);
    blas_->weight_grad(b.q, q_cols, x_rows, c, n, k, g.dfirst, 1.0f, s, b.lt, ws);
    if (gated) blas_->weight_grad(q_second, q_cols, x_rows, c, n, k, g.dup, 1.0f, s, b.lt, ws);
    blas_->weight_grad(b.p, n, dy_rows, c, n, k, g.ddown, 1.0f, s, b.lt, ws);
    routed_chunk(x, dy, g, b, rows, l1, chunk, first, s, ChunkPart::weight_grads);
  }
}

// The kernels' share of one chunk: rows s >= first of the routed list within `chunk`.
void CudaTraining::routed_chunk(const void* x, const void* dy, const Grads& g, const RoutedBuffers& b,
                                int64_t rows, const L1Coef& l1, RoutedChunk chunk, int64_t first, cudaStream_t s,
                                ChunkPart part) {
  const bool gated = dims_.kind == FfnKind::gated;
  const int64_t n = dims_.n, k = dims_.k;
  const int64_t q_cols = gated ? 2 * n : n;
  char* q_second = b.q + size_t(n) * dtype_size(dims_.dtype);
  const bool all = part == ChunkPart::all;
  const RoutedGemm gemm{{b.order, b.count, rows, first, chunk}, dims_.dtype, k, b.split_k};

  if (all || part == ChunkPart::hidden) {
    // g -> p;  gated: u -> q[:, :N];  dh -> q[:, N:] (plain: q);  then dg, du into q, h into p.
    RecomputeArgs r{gemm, x, first_weight(), b.p, n, n};
    launch_routed_recompute(r, device_, s);
    r.ldo = q_cols;
    if (gated) {
      r.weight = weights_.up.data;
      r.out = b.q;
      launch_routed_recompute(r, device_, s);
    }
    r.src = dy;
    r.weight = weights_.down.data;
    r.out = gated ? q_second : b.q;
    launch_routed_recompute(r, device_, s);
    launch_routed_hidden({{dims_.kind, dims_.dtype, n, rows, l1}, b.p, b.q, b.count, chunk}, device_, s);
  }
  if (all || part == ChunkPart::input_grad) {
    // dx rows = [dg | du] [W1; Wu]  (plain: dg W1)
    launch_routed_input_grad({gemm, b.q, q_cols, {first_weight(), gated ? weights_.up.data : nullptr, n}, g.dx},
                             device_, s);
  }
  if (all || part == ChunkPart::weight_grads) {
    // dW1 += dg^T x;  gated: dWu += du^T x;  dWd += h^T dy
    WeightGradGemmArgs w{gemm, b.q, q_cols, x, g.dfirst, n};
    launch_routed_weight_grad(w, device_, s);
    if (gated) {
      w.grad = q_second;
      w.dw = g.dup;
      launch_routed_weight_grad(w, device_, s);
    }
    w.grad = b.p;
    w.lda = n;
    w.src = dy;
    w.dw = g.ddown;
    launch_routed_weight_grad(w, device_, s);
  }
}

}  // namespace twell::gpu::training
