// Training forward over the compact (non-routed) rows of the saved layout: the up projection at
// the active entries (saved as plane 1), y and the per-row L1 sum.
//   gated: u = <x[m], Wu[n]> rounded to the dtype -> plane 1;  h = g * u;   plain: h = g
//   y[m] = sum h Wd[n] (fp32, rounded once);  row_l1[m] = sum |h| (in entry order)
//   CTA: one row (grid = M); a routed row exits at once (the routed-row backup writes it).
//   warp: 32 lanes of the row's K range; each batch of up-dots is reduced across warps in shared memory.
//   thread: kVecs 16-byte vectors of K (vector v = thread + j * blockDim), holding x[m] and the fp32
//           accumulators of y[m] in registers; entries are consumed kBatch at a time.
#include "cuda/cuda_check.hpp"
#include "cuda/train_kernels.hpp"
#include "cuda/train_rows.cuh"

namespace twell::gpu {

namespace {

using rows::kBatch;

template <typename T, FfnKind kKind, int kVecs>
__global__ void __launch_bounds__(TrainRowConfig::kMaxThreads)
    forward_rows_kernel(const T* __restrict__ x, const T* __restrict__ up,
                        const T* __restrict__ down, T* __restrict__ y, float* __restrict__ row_l1,
                        int64_t k, TwellView tw) {
  __shared__ rows::RowShared sm;
  const int64_t row = blockIdx.x;
  if (tw.row_slot[row] >= 0) return;
  const int num_tiles = tiles_of(tw.shape);
  rows::stage_counts(sm, tw, row, num_tiles);

  const int64_t vectors = k / kVecElems;
  auto* values = static_cast<T*>(tw.values);
  T* plane1 = values + plane_elements(tw.shape);
  float xr[kVecs][kVecElems];
  float acc[kVecs][kVecElems];
  if constexpr (kKind == FfnKind::gated) rows::load_row<T, kVecs>(x + row * k, vectors, xr);
#pragma unroll
  for (int j = 0; j < kVecs; ++j)
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) acc[j][e] = 0.0f;
  __syncthreads();

  rows::EntryCursor cur;
  int buffer = 0;
  float l1 = 0.0f;
  for (;;) {
    int neuron[kBatch];
    int64_t slot[kBatch];
    const int taken = cur.next(sm, num_tiles, tw, row, neuron, slot);
    if (taken == 0) break;
    float h[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) h[b] = b < taken ? Elem<T>::to_float(values[slot[b]]) : 0.0f;

    if constexpr (kKind == FfnKind::gated) {
      float dot[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        dot[b] = b < taken ? rows::partial_dot<T, kVecs>(xr, up + int64_t(neuron[b]) * k, vectors) : 0.0f;
      rows::reduce_batch(dot, sm, buffer);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (b >= taken) continue;
        const T u = Elem<T>::from_float(dot[b]);
        if (threadIdx.x == 0) plane1[slot[b]] = u;
        h[b] *= Elem<T>::to_float(u);
      }
    }

#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (b >= taken) continue;
      l1 += fabsf(h[b]);
      rows::axpy_row<T, kVecs>(h[b], down + int64_t(neuron[b]) * k, vectors, acc);
    }
  }

  rows::store_row<T, kVecs>(y + row * k, vectors, acc);
  if (row_l1 != nullptr && threadIdx.x == 0) row_l1[row] = l1;
}

}  // namespace

void launch_forward_rows(const ForwardRowsArgs& a, cudaStream_t s) {
  const char* op = "TrainingPlan::forward";
  if (a.saved.shape.rows == 0) return;
  rows::dispatch_rows(a.saved.dtype, a.kind, a.k, op, [&](auto tag, auto kind, auto vecs, int threads) {
    using T = decltype(tag);
    forward_rows_kernel<T, decltype(kind)::value, decltype(vecs)::value>
        <<<unsigned(a.saved.shape.rows), unsigned(threads), 0, s>>>(
            static_cast<const T*>(a.x), static_cast<const T*>(a.up), static_cast<const T*>(a.down),
            static_cast<T*>(a.y), a.row_l1, a.k, a.saved);
  });
  check_launch(op, "training forward rows kernel");
}

}  // namespace twell::gpu
