// The warp-per-row kernel: one kernel, templated on the pass, for inference's row stage
// (row_ffn.cu) and training's forward and backward compact rows (forward_rows.cu, backward_rows.cu).
//   grid: persistent CTAs of Pass::kWarps warps; a warp takes rows from its queue (next_row) one at
//     a time until it runs past the rows.
//   row: routed rows and rows marked for routing are skipped (the pass's long-row kernel or the
//     dense backup writes them); compact rows over Pass::long_row(a) entries are listed for the pass's
//     long-row kernel (warp_rows::short_row_entries); a row without entries is first offered to
//     Pass::empty_row, which may write it whole; the others are the warp's: Pass::row computes the
//     row (inference: its columns of one range of K) into fp32 accumulators of the lane's columns
//     (warp_rows.cuh's split of K) and Pass::store writes them (not in the dots phase, which keeps
//     its per-entry results itself).
// Pass provides, on the device:
//   Args, the kernel argument, with its TwellView tw;
//   kWarps and kMinCtasPerSm (launch bounds; 0: no minimum);
//   long_row(a): the most entries of a row the warp takes (longer ones are listed);
//   empty_row<T, kPhase>(a, row, lane): true where it has written a row without entries (nothing
//     more is done for it), false to run it as any other row;
//   enter(a): the kernel's programmatic-dependent-launch entry;
//   queue<kPhase>(a): the phase's warp_rows::RowQueue;
//   wait(a, row, known, lane): before a row is read (an overlapped stage waits for its producer;
//     `known` is the warp's state, -1 at first);
//   row<T, kKind, kChunks, kPhase>(a, row, lane, acc, extra): the row into acc and a per-row sum;
//   store<T, kChunks>(a, row, lane, acc, extra).
// The row loop is written out rather than a lambda passed to a helper: a lambda body cost the
// inference kernel up to 22 registers.
#pragma once
#include <cstdint>

#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/rows/warp_rows.cuh"
#include "twell/format.hpp"

namespace twell::gpu::rows {

template <typename Pass, typename T, FfnKind kKind, int kChunks, warp_rows::Phase kPhase>
__global__ void __launch_bounds__(Pass::kWarps * kWarpSize, Pass::kMinCtasPerSm)
    warp_row_kernel(typename Pass::Args a) {
  Pass::enter(a);
  const int lane = threadIdx.x % kWarpSize;
  const warp_rows::RowQueue queue = Pass::template queue<kPhase>(a);
  int64_t known = -1;
  for (;;) {
    const int64_t row = warp_rows::next_row(queue.head, lane);
    if (row >= a.tw.shape.rows) return;
    Pass::wait(a, row, known, lane);
    const int entries = warp_rows::short_row_entries(a.tw, row, Pass::long_row(a), lane, queue);
    if (entries < 0) continue;
    if (entries == 0 && Pass::template empty_row<T, kPhase>(a, row, lane)) continue;
    float acc[kChunks][kVecElems];
    float extra = 0.0f;
    Pass::template row<T, kKind, kChunks, kPhase>(a, row, lane, acc, extra);
    if constexpr (kPhase != warp_rows::Phase::dots) Pass::template store<T, kChunks>(a, row, lane, acc, extra);
  }
}

}  // namespace twell::gpu::rows
