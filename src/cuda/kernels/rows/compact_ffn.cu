// Fused up + down over the compact (non-routed) rows of a TwELL matrix:
//   y[m] = sum over entries (n, g) of h * Wd[n],  h = g * <x[m], Wu[n]> (gated) or h = g (plain).
//   CTA: one row (grid = M); a routed row exits at once (the dense backup writes it).
//   warp: 32 lanes of the row's K range; a CTA's warps reduce each batch of up-dots in shared memory.
//   thread: kVecs 16-byte vectors of K (vector v = thread + j * blockDim), holding x[m] and the
//           fp32 accumulators of y[m] in registers; entries are consumed kBatch at a time.
#include <string>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/inference.hpp"
#include "cuda/kernels/rows/cta_vectors.cuh"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

constexpr int kBatch = CompactConfig::kBatch;

static_assert(CompactConfig::kMaxThreads % kWarpSize == 0 && CompactConfig::kMaxThreads <= 1024,
              "the CTA ceiling must be whole warps within the CTA size limit");
static_assert(ShapeLimits::kMaxHidden / kVecElems <=
                  int64_t(CompactConfig::kMaxThreads) * CompactConfig::kVectorsPerThread,
              "the largest K must fit one CTA");
static_assert(ShapeLimits::kMaxIntermediate / CompactConfig::kMinTile <= CompactConfig::kMaxTiles,
              "a row's tile counts must fit the shared staging array");

// Walks a row's entries tile by tile (tile counts staged in shared memory); every thread of the
// CTA walks the same cursor, so the batch is uniform without a broadcast.
struct EntryCursor {
  int tile = 0;
  int index = 0;
};

template <typename T>
__device__ __forceinline__ int next_batch(EntryCursor& cur, const uint16_t* counts, int num_tiles,
                                          const TwellView& tw, int64_t row, int (&neuron)[kBatch],
                                          float (&g)[kBatch]) {
  const auto* values = static_cast<const T*>(tw.values);
  int taken = 0;
#pragma unroll
  for (int b = 0; b < kBatch; ++b) {
    while (cur.tile < num_tiles && cur.index >= counts[cur.tile]) {
      ++cur.tile;
      cur.index = 0;
    }
    neuron[b] = 0;
    g[b] = 0.0f;
    if (cur.tile < num_tiles) {
      const int64_t slot = (row * num_tiles + cur.tile) * tw.shape.capacity + cur.index;
      neuron[b] = cur.tile * tw.shape.tile + tw.cols[slot];
      g[b] = Elem<T>::to_float(values[slot]);
      ++cur.index;
      taken = b + 1;
    }
  }
  return taken;
}

template <typename T, FfnKind kKind, int kVecs>
__global__ void __launch_bounds__(CompactConfig::kMaxThreads)
    compact_ffn_kernel(const T* __restrict__ x, const T* __restrict__ up,
                       const T* __restrict__ down, T* __restrict__ y, int64_t k, TwellView tw) {
  chain_entry();
  __shared__ uint16_t counts[CompactConfig::kMaxTiles];
  __shared__ float partial[2][CompactConfig::kMaxWarps][kBatch];

  const int64_t row = blockIdx.x;
  if (tw.row_slot[row] >= 0) return;
  const int num_tiles = int((tw.shape.cols + tw.shape.tile - 1) / tw.shape.tile);
  for (int t = threadIdx.x; t < num_tiles; t += blockDim.x) counts[t] = tw.counts[row * num_tiles + t];

  const int64_t vectors = k / kVecElems;
  float xr[kVecs][kVecElems];
  float acc[kVecs][kVecElems];
  rows::load_row<T, kVecs>(x + row * k, vectors, xr);
#pragma unroll
  for (int j = 0; j < kVecs; ++j)
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) acc[j][e] = 0.0f;
  __syncthreads();

  EntryCursor cur;
  int buffer = 0;
  for (;;) {
    int neuron[kBatch];
    float h[kBatch];
    const int taken = next_batch<T>(cur, counts, num_tiles, tw, row, neuron, h);
    if (taken == 0) break;

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
  }

  rows::store_row<T, kVecs>(y + row * k, vectors, acc);
}

template <typename T, FfnKind kKind, int kVecs>
void launch_with(const CompactArgs& a, int threads, cudaStream_t s) {
  launch(compact_ffn_kernel<T, kKind, kVecs>, dim3(unsigned(a.twell.shape.rows)), dim3(unsigned(threads)), 0,
         s, static_cast<const T*>(a.x), static_cast<const T*>(a.up), static_cast<const T*>(a.down),
         static_cast<T*>(a.y), a.hidden, a.twell);
}

template <typename T, FfnKind kKind>
void launch_kind(const CompactArgs& a, int vecs, int threads, cudaStream_t s) {
  switch (vecs) {
    case 1: launch_with<T, kKind, 1>(a, threads, s); return;
    case 2: launch_with<T, kKind, 2>(a, threads, s); return;
    default: launch_with<T, kKind, CompactConfig::kVectorsPerThread>(a, threads, s); return;
  }
}

}  // namespace

void launch_compact_ffn(const CompactArgs& a, cudaStream_t s) {
  if (a.twell.shape.rows == 0) return;
  // Small K: one warp, 1 or 2 vectors per lane; larger K: kVectorsPerThread per thread, as many
  // warps as that takes (K = 2048: 64 threads, K = 16384: 512).
  const int64_t vectors = a.hidden / kVecElems;
  const int vecs = vectors <= kWarpSize ? 1 : vectors <= 2 * kWarpSize ? 2 : CompactConfig::kVectorsPerThread;
  const int64_t owners = (vectors + vecs - 1) / vecs;
  const int threads = int((owners + kWarpSize - 1) / kWarpSize * kWarpSize);
  if (threads > CompactConfig::kMaxThreads)
    throw Error("InferencePlan::run", "hidden size K",
                "at most " + std::to_string(ShapeLimits::kMaxHidden), std::to_string(a.hidden));
  with_element_type(a.twell.dtype, "InferencePlan::run", [&](auto tag) {
    using T = decltype(tag);
    if (a.kind == FfnKind::gated)
      launch_kind<T, FfnKind::gated>(a, vecs, threads, s);
    else
      launch_kind<T, FfnKind::plain>(a, vecs, threads, s);
  });
  check_launch("InferencePlan::run", "compact up+down kernel");
}

}  // namespace twell::gpu
