// Fused up + down over the compact (non-routed) rows of a TwELL matrix:
//   y[m] = sum over entries (n, g) of h * Wd[n],  h = g * <x[m], Wu[n]> (gated) or h = g (plain).
//   CTA: one row (grid = M); a routed row exits at once (the dense backup writes it).
//   warp: 32 lanes of the row's K range; a CTA's warps reduce each batch of up-dots in shared memory.
//   thread: 1, 2 or kVectorsPerThread 16-byte vectors of K (vector v = thread + j * blockDim),
//           holding x[m] and the fp32 accumulators of y[m] in registers; entries are consumed
//           kBatch at a time.
// The CTA-per-row family of cta_rows.cuh (row shape, launch, entry cursor, batch reduction),
// shared with training's compact-row passes.
#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/inference.hpp"
#include "cuda/kernels/rows/cta_rows.cuh"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

using rows::kBatch;

template <typename T, FfnKind kKind, int kVecs>
__global__ void __launch_bounds__(CtaRowConfig::kMaxThreads)
    compact_ffn_kernel(const T* __restrict__ x, const T* __restrict__ up,
                       const T* __restrict__ down, T* __restrict__ y, int64_t k, TwellView tw) {
  chain_entry();
  __shared__ rows::RowCounts counts;
  __shared__ rows::BatchPartials partial;

  const int64_t row = blockIdx.x;
  if (tw.row_slot[row] >= 0) return;
  const int num_tiles = int((tw.shape.cols + tw.shape.tile - 1) / tw.shape.tile);
  rows::stage_counts(counts, tw, row, num_tiles);

  const int64_t vectors = k / kVecElems;
  const auto* values = static_cast<const T*>(tw.values);
  float xr[kVecs][kVecElems];
  float acc[kVecs][kVecElems];
  rows::load_row<T, kVecs>(x + row * k, vectors, xr);
#pragma unroll
  for (int j = 0; j < kVecs; ++j)
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) acc[j][e] = 0.0f;
  __syncthreads();

  // The dot and axpy loops are written out rather than rows::batch_dots / axpy_row: through those
  // the compiler keeps each entry's row offset live across the thread's vectors (up to 15 more
  // registers here).
  int buffer = 0;
  auto gate = [&](int64_t slot) { return Elem<T>::to_float(values[slot]); };
  rows::for_each_batch(counts, num_tiles, tw, row, gate,
                       [&](const int (&neuron)[kBatch], const float (&g)[kBatch], int taken) {
    float h[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) h[b] = g[b];

    if constexpr (kKind == FfnKind::gated) {
      float dot[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        dot[b] = 0.0f;
        if (b >= taken) continue;
        rows::for_each_vector<kVecs>(vectors, [&](int j, int64_t v) {
          float w[kVecElems];
          unpack8<T>(load_readonly(up + int64_t(neuron[b]) * k + v * kVecElems), w);
#pragma unroll
          for (int e = 0; e < kVecElems; ++e) dot[b] = fmaf(xr[j][e], w[e], dot[b]);
        });
      }
      rows::reduce_batch(dot, partial, buffer);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) h[b] *= dot[b];
    }

#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (b >= taken) continue;
      rows::for_each_vector<kVecs>(vectors, [&](int j, int64_t v) {
        float w[kVecElems];
        unpack8<T>(load_readonly(down + int64_t(neuron[b]) * k + v * kVecElems), w);
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) acc[j][e] = fmaf(h[b], w[e], acc[j][e]);
      });
    }
  });

  rows::store_row<T, kVecs>(y + row * k, vectors, acc);
}

}  // namespace

void launch_compact_ffn(const CompactArgs& a, cudaStream_t s) {
  if (a.twell.shape.rows == 0) return;
  // rows::row_shape: K = 2048 is 64 threads of 4 vectors, K = 16384 is 512.
  rows::dispatch_rows(a.twell.dtype, a.kind, a.hidden, "InferencePlan::run",
                      [&](auto tag, auto kind_c, auto vecs, int threads) {
                        using T = decltype(tag);
                        launch(compact_ffn_kernel<T, decltype(kind_c)::value, decltype(vecs)::value>,
                               dim3(unsigned(a.twell.shape.rows)), dim3(unsigned(threads)), 0, s,
                               static_cast<const T*>(a.x), static_cast<const T*>(a.up),
                               static_cast<const T*>(a.down), static_cast<T*>(a.y), a.hidden, a.twell);
                      });
  check_launch("InferencePlan::run", "compact up+down kernel");
}

}  // namespace twell::gpu
