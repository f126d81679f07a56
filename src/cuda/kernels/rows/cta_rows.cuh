// Device code shared by the compact-row passes (forward_rows.cu, backward_rows.cu):
// the CTA shape over a K-wide row, a cursor over one row's TwELL entries, and the CTA-wide
// reduction of a batch of dot products in the pass's shared memory. A row is owned by one CTA;
// thread t owns the 16-byte vectors v = t + j * blockDim (j < kVecs) of K (cta_vectors.cuh: the
// loads, stores, dots and axpys over them, and the reduction).
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/train_device.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/rows/cta_vectors.cuh"
#include "cuda/kernels/rows/warp_rows.cuh"
#include "cuda/policy/train_config.hpp"
#include "cuda/runtime/device.hpp"
#include "twell/format.hpp"

namespace twell::gpu::rows {

constexpr int kBatch = TrainRowConfig::kBatch;
constexpr int kMaxWarps = TrainRowConfig::kMaxWarps;

static_assert(TrainRowConfig::kMaxThreads % kWarpSize == 0 && TrainRowConfig::kMaxThreads <= 1024,
              "the CTA ceiling must be whole warps within the CTA size limit");
static_assert(ShapeLimits::kMaxHidden / kVecElems <=
                  int64_t(TrainRowConfig::kMaxThreads) * TrainRowConfig::kVectorsPerThread,
              "the largest K must fit one CTA");

// Host: vectors per thread (1, 2 or kVectorsPerThread) and threads per CTA for a K-wide row.
// Small K: one warp; larger K: kVectorsPerThread per thread, as many warps as that takes.
struct RowShape {
  int vecs = 1;
  int threads = kWarpSize;
};
inline RowShape row_shape(int64_t k) {
  const int64_t vectors = k / kVecElems;
  RowShape r;
  r.vecs = vectors <= kWarpSize ? 1 : vectors <= 2 * kWarpSize ? 2 : TrainRowConfig::kVectorsPerThread;
  const int64_t owners = (vectors + r.vecs - 1) / r.vecs;
  r.threads = int((owners + kWarpSize - 1) / kWarpSize * kWarpSize);
  return r;
}

// Host: calls launch(T{}, kind constant, vecs constant, threads) with the element type of `dtype`,
// the FFN kind and the vectors per thread of row_shape(k) as compile-time constants, so a kernel
// template <T, kKind, kVecs> is instantiated once per combination and launched with its CTA size.
template <typename Launch>
void dispatch_rows(DType dtype, FfnKind kind, int64_t k, const char* op, Launch&& launch) {
  const RowShape shape = row_shape(k);
  with_element_type(dtype, op, [&](auto tag) {
    auto by_vecs = [&](auto kind_c) {
      switch (shape.vecs) {
        case 1: return launch(tag, kind_c, std::integral_constant<int, 1>{}, shape.threads);
        case 2: return launch(tag, kind_c, std::integral_constant<int, 2>{}, shape.threads);
        default:
          return launch(tag, kind_c, std::integral_constant<int, TrainRowConfig::kVectorsPerThread>{},
                        shape.threads);
      }
    };
    if (kind == FfnKind::gated)
      by_vecs(std::integral_constant<FfnKind, FfnKind::gated>{});
    else
      by_vecs(std::integral_constant<FfnKind, FfnKind::plain>{});
  });
}

// Host: calls launch(T{}, kind constant, chunks constant) for the warp-per-row kernels
// (warp_rows::supports(k)), the K / 256 chunks of a row a compile-time constant.
template <typename Launch>
void dispatch_warp_rows(DType dtype, FfnKind kind, int64_t k, const char* op, Launch&& launch) {
  with_element_type(dtype, op, [&](auto tag) {
    warp_rows::with_chunks(int(k / RowConfig::kChunk), [&](auto chunks) {
      if (kind == FfnKind::gated)
        launch(tag, std::integral_constant<FfnKind, FfnKind::gated>{}, chunks);
      else
        launch(tag, std::integral_constant<FfnKind, FfnKind::plain>{}, chunks);
    });
  });
}

// Host: the grids of a compact-row pass with the warp kernels (K supported): the warp kernel's
// persistent grid, and the long-row kernel's grid-stride CTAs over its list.
struct PassGrid {
  bool warp = false;
  unsigned warp_ctas = 0;
  unsigned warp_threads = TrainRowConfig::kWarpRowWarps * kWarpSize;
  unsigned long_ctas = 0;
  unsigned long_threads = TrainRowConfig::kLongRowWarps * kWarpSize;
};
inline PassGrid pass_grid(int64_t rows, int64_t k, const DeviceInfo& dev) {
  PassGrid g;
  g.warp = warp_rows::supports(k);
  g.warp_ctas = unsigned(std::min<int64_t>(int64_t(dev.sm_count) * TrainRowConfig::kWarpRowCtasPerSm,
                                           (rows + TrainRowConfig::kWarpRowWarps - 1) / TrainRowConfig::kWarpRowWarps));
  g.long_ctas = unsigned(std::min<int64_t>(rows, int64_t(dev.sm_count) * TrainRowConfig::kLongRowCtasPerSm));
  return g;
}

// Shared memory of a row pass: the row's tile counts and the cross-warp partial dots
// (double-buffered: one barrier per batch).
struct RowShared {
  uint16_t counts[TrainRowConfig::kMaxTiles];
  float partial[2][kMaxWarps][kBatch];
};

// Stages the row's tile counts; the caller synchronises before the cursor reads them.
__device__ __forceinline__ void stage_counts(RowShared& sm, const TwellView& tw, int64_t row,
                                             int num_tiles) {
  for (int t = threadIdx.x; t < num_tiles; t += blockDim.x) sm.counts[t] = tw.counts[row * num_tiles + t];
}

// A row's entries, kBatch at a time, in TwELL order (tiles ascending, columns ascending within a
// tile). Every thread of the CTA walks the same cursor, so batches are uniform without a broadcast.
struct EntryCursor {
  int tile = 0;
  int index = 0;

  // Fills neuron[b] and slot[b] for b < the returned count (unused ones get neuron 0, slot 0).
  __device__ __forceinline__ int next(const RowShared& sm, int num_tiles, const TwellView& tw,
                                      int64_t row, int (&neuron)[kBatch], int64_t (&slot)[kBatch]) {
    int taken = 0;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      while (tile < num_tiles && index >= sm.counts[tile]) {
        ++tile;
        index = 0;
      }
      neuron[b] = 0;
      slot[b] = 0;
      if (tile < num_tiles) {
        slot[b] = (row * num_tiles + tile) * tw.shape.capacity + index;
        neuron[b] = tile * tw.shape.tile + tw.cols[slot[b]];
        ++index;
        taken = b + 1;
      }
    }
    return taken;
  }
};

// Sums each dot[b] over the CTA through sm.partial (cta_vectors.cuh); every thread ends with the
// same totals. Must be reached by every thread of the CTA.
__device__ __forceinline__ void reduce_batch(float (&dot)[kBatch], RowShared& sm, int& buffer) {
  reduce_batch(dot, sm.partial, buffer);
}

}  // namespace twell::gpu::rows
