// Training's dense saved form (saved.shape.backup_capacity == M; automatic dispatch picks it above
// dense_above): cuBLAS(Lt) GEMMs and elementwise passes, the saved planes holding G and U.
//   forward:  G = x W1^T and U = x Wu^T (cuBLASLt) straight into the backup planes ->
//             h = relu(G) U (plain: relu(G), over G) and the activation count -> y = h Wd -> layout
//             (every row routed) -> stats
//   backward: dh = dy Wd^T -> [dg | du], h (elementwise) -> dx = [dg | du] [Wg; Wu] (cuBLASLt,
//             depth 2N) -> dWg, dWu, dWd (cuBLAS, fp32 out)
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"
#include "cuda/training/backend.hpp"

namespace twell::gpu::training {

void CudaTraining::forward_dense(const TrainingForwardArgs& args, const TwellView& saved, int64_t rows,
                                 char* base, cudaStream_t s) {
  const TrainForwardLayout l = train_forward_layout(dims_, rows);
  auto* active = at<unsigned long long>(base, l.active);
  auto* stats = static_cast<float*>(args.stats.data);
  const bool gated = dims_.kind == FfnKind::gated;
  const int64_t n = dims_.n, k = dims_.k;
  const size_t plane = size_t(rows) * size_t(n) * dtype_size(dims_.dtype);
  char* g_plane = static_cast<char*>(saved.backup);  // relu(x W1^T): gated g, plain h
  char* u_plane = g_plane + plane;                    // gated: x Wu^T
  void* h = gated ? base + l.hidden : g_plane;

  lt_->run(linear_call(GemmId::gate, rows, n, k, args.x.data, first_weight(), g_plane), s, base + l.lt);
  if (gated) lt_->run(linear_call(GemmId::up, rows, n, k, args.x.data, weights_.up.data, u_plane), s, base + l.lt);
  // The statistics' sum |h| comes from this pass (per-CTA sums in row_l1's space), not a re-read of h.
  float* l1_partials = stats != nullptr ? at<float>(base, l.row_l1) : nullptr;
  const int64_t partials =
      launch_dense_hidden({dims_.kind, dims_.dtype, g_plane, u_plane, h, rows * n, active, l1_partials}, device_, s);
  lt_->run(matmul_call(GemmId::down, rows, k, n, h, weights_.down.data, args.y.data), s, base + l.lt);
  launch_dense_layout(saved, device_, s);
  launch_statistics(saved, h, active, l1_partials, stats, rows, s, partials);
}

void CudaTraining::backward_dense(const TrainingBackwardArgs& args, const TensorView& x, const TwellView& saved,
                                  const Grads& g, int64_t rows, char* base, const L1Coef& l1, cudaStream_t s) {
  const TrainDenseBackwardLayout l = dense_backward_layout(rows);
  const bool gated = dims_.kind == FfnKind::gated;
  const int64_t n = dims_.n, k = dims_.k;
  const size_t es = dtype_size(dims_.dtype);
  const size_t plane = size_t(rows) * size_t(n) * es;
  const char* g_plane = static_cast<const char*>(saved.backup);
  const char* u_plane = g_plane + plane;
  char* q = base + l.q;
  char* dh = base + l.dh;
  const void* h = gated ? static_cast<const void*>(dh) : g_plane;  // h overwrites dh

  // dh = dy Wd^T -> dg, du into q; h over dh
  lt_->run(linear_call(GemmId::grad_hidden, rows, n, k, args.dy.data, weights_.down.data, dh), s, base + l.lt);
  launch_dense_backward_hidden(
      {{dims_.kind, dims_.dtype, n, rows, l1}, g_plane, gated ? u_plane : nullptr, dh, q, gated ? dh : nullptr},
      device_, s);

  // dx = [dg | du] [Wg; Wu] (one GEMM of depth 2N over a copy of the two weights, or over the
  // weights themselves where Wu follows Wg in memory, as a fused gate-up parameter has them);
  // plain: dg Wu
  const void* stacked = first_weight();
  if (copies_weights()) {
    const size_t bytes = size_t(n * k) * es;
    check_cuda(cudaMemcpyAsync(base + l.stacked, weights_.gate.data, bytes, cudaMemcpyDeviceToDevice, s),
               kBackwardOp, "stacked weights");
    check_cuda(cudaMemcpyAsync(base + l.stacked + bytes, weights_.up.data, bytes, cudaMemcpyDeviceToDevice, s),
               kBackwardOp, "stacked weights");
    stacked = base + l.stacked;
  }
  lt_->run(matmul_call(GemmId::grad_input, rows, k, gated ? 2 * n : n, q, stacked, g.dx), s, base + l.lt);

  // dW1 = dg^T x;  gated: dWu = du^T x (one GEMM into [dWg; dWu] where dWu follows dWg in memory);
  // dWd = h^T dy
  const int64_t ldq = gated ? 2 * n : n;
  void* ws = base + l.lt;
  const size_t wsb = LtConfig::kWorkspaceBytes;
  const bool adjacent_grads = gated && g.dup == g.dfirst + n * k;
  blas_->weight_grad(q, ldq, x.data, rows, adjacent_grads ? 2 * n : n, k, g.dfirst, 0.0f, s, ws, wsb);
  if (gated && !adjacent_grads)
    blas_->weight_grad(q + size_t(n) * es, ldq, x.data, rows, n, k, g.dup, 0.0f, s, ws, wsb);
  blas_->weight_grad(h, n, args.dy.data, rows, n, k, g.ddown, 0.0f, s, ws, wsb);
}

}  // namespace twell::gpu::training
