// Training backward over the compact (non-routed) rows of the saved layout: the hidden gradient at
// each active entry (kept per slot for the weight gradients) and dx.
//   dh = <dy[m], Wd[n]> + l1 * sign(h) / M;  gated: dg = dh * u, du = dh * g;  plain: dg = dh
//   dx[m] = sum dg W1[n] + du Wu[n] (fp32, rounded once)
//   CTA: one row (grid = M); a routed row exits at once (the dense routed-row path writes it).
//   warp: 32 lanes of the row's K range; each batch of down-dots is reduced across warps in shared memory.
//   thread: kVecs 16-byte vectors of K (vector v = thread + j * blockDim), holding dy[m] and the fp32
//           accumulators of dx[m] in registers; entries are consumed kBatch at a time.
#include "cuda/cuda_check.hpp"
#include "cuda/train_kernels.hpp"
#include "cuda/train_rows.cuh"

namespace twell::gpu {

namespace {

using rows::kBatch;

template <typename T, FfnKind kKind, int kVecs>
__global__ void __launch_bounds__(TrainRowConfig::kMaxThreads)
    backward_rows_kernel(const T* __restrict__ dy, const T* __restrict__ first,
                         const T* __restrict__ up, const T* __restrict__ down, T* __restrict__ dx,
                         float* __restrict__ dh_out, L1Coef l1, int64_t k, TwellView tw) {
  __shared__ rows::RowShared sm;
  const int64_t row = blockIdx.x;
  if (tw.row_slot[row] >= 0) return;
  const int num_tiles = tiles_of(tw.shape);
  rows::stage_counts(sm, tw, row, num_tiles);

  const int64_t vectors = k / kVecElems;
  const auto* values = static_cast<const T*>(tw.values);
  const T* plane1 = values + plane_elements(tw.shape);
  const float scale = l1_scale(l1, tw.shape.rows);
  float dyr[kVecs][kVecElems];
  float acc[kVecs][kVecElems];
  rows::load_row<T, kVecs>(dy + row * k, vectors, dyr);
#pragma unroll
  for (int j = 0; j < kVecs; ++j)
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) acc[j][e] = 0.0f;
  __syncthreads();

  rows::EntryCursor cur;
  int buffer = 0;
  for (;;) {
    int neuron[kBatch];
    int64_t slot[kBatch];
    const int taken = cur.next(sm, num_tiles, tw, row, neuron, slot);
    if (taken == 0) break;

    float dot[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      dot[b] = b < taken ? rows::partial_dot<T, kVecs>(dyr, down + int64_t(neuron[b]) * k, vectors) : 0.0f;
    rows::reduce_batch(dot, sm, buffer);

#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (b >= taken) continue;
      const float g = Elem<T>::to_float(values[slot[b]]);
      const float u = kKind == FfnKind::gated ? Elem<T>::to_float(plane1[slot[b]]) : 1.0f;
      const float dh = dot[b] + scale * sign_of(g * u);
      if (threadIdx.x == 0) dh_out[slot[b]] = dh;
      rows::axpy_row<T, kVecs>(dh * u, first + int64_t(neuron[b]) * k, vectors, acc);
      if constexpr (kKind == FfnKind::gated)
        rows::axpy_row<T, kVecs>(dh * g, up + int64_t(neuron[b]) * k, vectors, acc);
    }
  }

  rows::store_row<T, kVecs>(dx + row * k, vectors, acc);
}

}  // namespace

void launch_backward_rows(const BackwardRowsArgs& a, cudaStream_t s) {
  const char* op = "TrainingPlan::backward";
  if (a.saved.shape.rows == 0) return;
  rows::dispatch_rows(a.saved.dtype, a.kind, a.k, op, [&](auto tag, auto kind, auto vecs, int threads) {
    using T = decltype(tag);
    backward_rows_kernel<T, decltype(kind)::value, decltype(vecs)::value>
        <<<unsigned(a.saved.shape.rows), unsigned(threads), 0, s>>>(
            static_cast<const T*>(a.dy), static_cast<const T*>(a.first), static_cast<const T*>(a.up),
            static_cast<const T*>(a.down), static_cast<T*>(a.dx), a.dh, a.l1, a.k, a.saved);
  });
  check_launch(op, "training backward rows kernel");
}

}  // namespace twell::gpu
