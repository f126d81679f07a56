// What training's compact-row passes (forward_rows.cu, backward_rows.cu) share:
// - run_pass: a pass on the warp kernels where K allows, else on a CTA per row;
// - the warp-per-row kernel family (warp_row_kernel, long_row_kernel), templated on the pass;
// - for the CTA kernels: the CTA shape over a K-wide row, a cursor over one row's TwELL entries and
//   the CTA-wide reduction of a batch of dot products in the pass's shared memory. A row is owned
//   by one CTA; thread t owns the 16-byte vectors v = t + j * blockDim (j < kVecs) of K
//   (cta_vectors.cuh: the loads, stores, dots and axpys over them, and the reduction).
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/train_device.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/rows/cta_vectors.cuh"
#include "cuda/kernels/rows/warp_rows.cuh"
#include "cuda/kernels/training.hpp"
#include "cuda/policy/train_config.hpp"
#include "cuda/runtime/cuda_check.hpp"
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

// The warp-per-row kernels of a training pass: one family for forward_rows.cu and backward_rows.cu.
// Pass provides
//   Pass::Args, holding tw, control and long_rows (the queue protocol, warp_rows.cuh);
//   Pass::row<T, kKind, kChunks, kPhase>(args, row, lane, first_group, group_step, acc, extra): one
//     warp's part of a compact row (entry groups first_group, first_group + group_step, ...) into
//     the lane's columns acc and a per-row sum `extra` (forward: the row's L1; backward: unused);
//   Pass::out(args), the [rows, K] output, and Pass::row_extra(args), where `extra` goes (or nullptr).

// Short compact rows, a warp each from the phase's queue; long ones are listed for long_row_kernel.
template <typename Pass, typename T, FfnKind kKind, int kChunks, warp_rows::Phase kPhase>
__global__ void __launch_bounds__(TrainRowConfig::kWarpRowWarps * kWarpSize, TrainRowConfig::kWarpRowCtasPerSm)
    warp_row_kernel(typename Pass::Args a) {
  chain_entry();
  constexpr int64_t k = int64_t(kChunks) * RowConfig::kChunk;
  const int lane = threadIdx.x % kWarpSize;
  auto short_row = [&](int64_t row) {
    float acc[kChunks][kVecElems];
    float extra = 0.0f;
    Pass::template row<T, kKind, kChunks, kPhase>(a, row, lane, 0, 1, acc, extra);
    if constexpr (kPhase == warp_rows::Phase::dots) return;
    warp_rows::store_row<T, kChunks>(static_cast<T*>(Pass::out(a)) + row * k, lane, acc);
    float* row_extra = Pass::row_extra(a);
    if (row_extra != nullptr && lane == 0) row_extra[row] = extra;
  };
  warp_rows::for_each_short_row<kPhase>(a.tw, a.control, a.long_rows, TrainRowConfig::kLongRow, lane, short_row);
}

// Long compact rows, a CTA each (grid-stride over the list): warp w takes entry groups w,
// w + warps, ...; the warps' partial sums of the output row and of `extra` meet in shared memory,
// added in warp order.
template <typename Pass, typename T, FfnKind kKind, int kChunks>
__global__ void __launch_bounds__(TrainRowConfig::kLongRowWarps * kWarpSize)
    long_row_kernel(typename Pass::Args a) {
  chain_entry();
  constexpr int kWarps = TrainRowConfig::kLongRowWarps;
  constexpr int kCols = kChunks * RowConfig::kChunk;
  __shared__ float partial[kWarps][kCols];
  __shared__ float partial_extra[kWarps];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  warp_rows::for_each_long_row(a.control, a.long_rows, [&](int64_t row) {
    float acc[kChunks][kVecElems];
    float extra = 0.0f;
    Pass::template row<T, kKind, kChunks, warp_rows::Phase::fused>(a, row, lane, warp, kWarps, acc, extra);
    if (lane == 0) partial_extra[warp] = extra;
    warp_rows::sum_warps<T>(partial, warp, lane, acc, static_cast<T*>(Pass::out(a)) + row * kCols);
    float* row_extra = Pass::row_extra(a);
    if (row_extra != nullptr && threadIdx.x == 0) {
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum += partial_extra[w];
      row_extra[row] = sum;
    }
    __syncthreads();  // partial is rewritten by the next row
  });
}

// Host: the warp kernel of each phase in `phases` order on the persistent grid, then the long-row
// kernel over its list.
template <typename Pass, typename T, FfnKind kKind, int kChunks, warp_rows::Phase... kPhases>
void launch_warp_pass(const PassGrid& grid, cudaStream_t s, const typename Pass::Args& args) {
  (launch(warp_row_kernel<Pass, T, kKind, kChunks, kPhases>, dim3(grid.warp_ctas), dim3(grid.warp_threads), 0, s,
          args),
   ...);
  launch(long_row_kernel<Pass, T, kKind, kChunks>, dim3(grid.long_ctas), dim3(grid.long_threads), 0, s, args);
}

// Host: a compact-row pass over saved.shape.rows rows. When the warp kernels support K: the row
// queues are cleared, then pass.warp<T, kKind, kChunks>(grid, s) launches them (launch_warp_pass);
// otherwise pass.cta<T, kKind, kVecs>(rows, threads, s) launches the CTA-per-row kernel.
template <typename Pass>
void run_pass(const Pass& pass, const TwellView& saved, FfnKind kind, int64_t k, int32_t* control,
              const DeviceInfo& dev, cudaStream_t s, const char* op) {
  const int64_t rows = saved.shape.rows;
  if (rows == 0) return;
  const PassGrid grid = pass_grid(rows, k, dev);
  if (grid.warp) {
    check_cuda(cudaMemsetAsync(control, 0, kRowQueueWords * sizeof(int32_t), s), op, "row queues");
    dispatch_warp_rows(saved.dtype, kind, k, op, [&](auto tag, auto kind_c, auto chunks) {
      pass.template warp<decltype(tag), decltype(kind_c)::value, decltype(chunks)::value>(grid, s);
    });
    check_launch(op, "warp-row kernels");
    return;
  }
  dispatch_rows(saved.dtype, kind, k, op, [&](auto tag, auto kind_c, auto vecs, int threads) {
    pass.template cta<decltype(tag), decltype(kind_c)::value, decltype(vecs)::value>(rows, threads, s);
  });
  check_launch(op, "CTA-row kernel");
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

// Calls f(neuron, slot, taken) for each batch of up to kBatch entries of `row`, in TwELL order
// (the row's counts staged by stage_counts and published by a barrier). Every thread of the CTA.
template <typename F>
__device__ __forceinline__ void for_each_batch(const RowShared& sm, int num_tiles, const TwellView& tw, int64_t row,
                                               F&& f) {
  EntryCursor cur;
  for (;;) {
    int neuron[kBatch];
    int64_t slot[kBatch];
    const int taken = cur.next(sm, num_tiles, tw, row, neuron, slot);
    if (taken == 0) return;
    f(neuron, slot, taken);
  }
}

// dot[b] = <row, weight[neuron[b]]> for the batch's b < taken (0 past them), summed over the CTA:
// `row` is the thread's vectors of a K-wide row. Every thread of the CTA; all end with the totals.
template <typename T, int kVecs>
__device__ __forceinline__ void batch_dots(const float (&row)[kVecs][kVecElems], const T* weight,
                                           const int (&neuron)[kBatch], int taken, int64_t k, RowShared& sm,
                                           int& buffer, float (&dot)[kBatch]) {
#pragma unroll
  for (int b = 0; b < kBatch; ++b)
    dot[b] = b < taken ? partial_dot<T, kVecs>(row, weight + int64_t(neuron[b]) * k, k / kVecElems) : 0.0f;
  reduce_batch(dot, sm.partial, buffer);  // cta_vectors.cuh
}

}  // namespace twell::gpu::rows
