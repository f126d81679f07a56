// What training's compact-row passes (forward_rows.cu, backward_rows.cu) share:
// - run_pass: a pass on the warp kernels where K allows, else on a CTA per row (the CTA-per-row
//   family of cta_rows.cuh, shared with inference's compact_ffn.cu);
// - TrainWarpPass, what both passes share as passes of warp_row_kernel.cuh's kernel, and
//   long_row_kernel, a CTA per long row, templated on the pass.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/train_device.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/rows/cta_rows.cuh"
#include "cuda/kernels/rows/warp_row_kernel.cuh"
#include "cuda/kernels/rows/warp_rows.cuh"
#include "cuda/kernels/training.hpp"
#include "cuda/policy/train_config.hpp"
#include "cuda/runtime/cuda_check.hpp"
#include "cuda/runtime/device.hpp"
#include "twell/format.hpp"

namespace twell::gpu::rows {

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

// What training's passes share as passes of warp_row_kernel (CRTP). Derived provides
//   part<T, kKind, kChunks, kPhase>(args, row, lane, first_group, group_step, acc, extra): one
//     warp's part of a compact row (entry groups first_group, first_group + group_step, ...) into
//     the lane's columns acc and a per-row sum `extra` (forward: the row's L1; backward: unused);
//   out(args), the [rows, K] output, and row_extra(args), where `extra` goes (or nullptr).
// ArgsT holds tw, control and long_rows: the queues are control[0] (dots or fused) and control[2]
// (axpys); the first phase lists the long rows at long_rows[control[1]++].
template <typename Derived, typename ArgsT>
struct TrainWarpPass {
  using Args = ArgsT;
  static constexpr int kWarps = TrainRowConfig::kWarpRowWarps;
  static constexpr int kMinCtasPerSm = TrainRowConfig::kWarpRowCtasPerSm;
  static __device__ int long_row(const Args&) { return TrainRowConfig::kLongRow; }
  template <typename T, warp_rows::Phase kPhase>
  static __device__ bool empty_row(const Args&, int64_t, int) { return false; }  // its L1 and dh rows too

  static __device__ void enter(const Args&) { chain_entry(); }

  template <warp_rows::Phase kPhase>
  static __device__ warp_rows::RowQueue queue(const Args& a) {
    if constexpr (kPhase == warp_rows::Phase::axpys)
      return {&a.control[2], nullptr, nullptr};
    else
      return {&a.control[0], a.long_rows, &a.control[1]};
  }

  static __device__ void wait(const Args&, int64_t, int64_t&, int) {}

  template <typename T, FfnKind kKind, int kChunks, warp_rows::Phase kPhase>
  static __device__ void row(const Args& a, int64_t row, int lane, float (&acc)[kChunks][kVecElems],
                             float& extra) {
    Derived::template part<T, kKind, kChunks, kPhase>(a, row, lane, 0, 1, acc, extra);
  }

  template <typename T, int kChunks>
  static __device__ void store(const Args& a, int64_t row, int lane, const float (&acc)[kChunks][kVecElems],
                               float extra) {
    constexpr int64_t k = int64_t(kChunks) * RowConfig::kChunk;
    warp_rows::store_row<T, kChunks>(static_cast<T*>(Derived::out(a)) + row * k, lane, acc);
    float* row_extra = Derived::row_extra(a);
    if (row_extra != nullptr && lane == 0) row_extra[row] = extra;
  }
};

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
    Pass::template part<T, kKind, kChunks, warp_rows::Phase::fused>(a, row, lane, warp, kWarps, acc, extra);
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

}  // namespace twell::gpu::rows
