// The saved layout's routed rows renumbered in ascending order (routed_rows, row_slot): backward's
// dense reductions over routed rows (weight gradients) then add them in an order that does not
// depend on the atomics that listed them in the pack.
//   CTA: the only one; it walks the rows kThreads x kRowsPerThread at a time, carrying the running
//        count.
//   warp: part of the CTA-wide exclusive scan of the threads' routed counts.
//   thread: kRowsPerThread consecutive rows per step: their flags (one bit each, all loads in
//           flight at once), the scan of their count, and the writes of the routed rows' positions.
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/scan.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/training.hpp"
#include "cuda/policy/train_config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

constexpr int kThreads = RoutedOrderConfig::kThreads;
constexpr int kRowsPerThread = RoutedOrderConfig::kRowsPerThread;
static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "whole warps within the CTA limit");
static_assert(kRowsPerThread >= 1 && kRowsPerThread <= 32, "a thread's flags are the bits of one word");

__global__ void __launch_bounds__(kThreads)
    renumber_kernel(int32_t* row_slot, int64_t rows, int32_t* __restrict__ routed_rows,
                    int32_t* __restrict__ num_routed) {
  chain_entry();
  // Every routed row took its slot from *num_routed (the pack's and the routing's atomics): none,
  // nothing to renumber.
  if (*num_routed == 0) return;
  __shared__ scan::ScanShared sm;
  constexpr int64_t kStep = int64_t(kThreads) * kRowsPerThread;
  int64_t base = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += kStep) {
    const int64_t first = r0 + int64_t(threadIdx.x) * kRowsPerThread;
    unsigned flags = 0;  // bit i: row first + i is routed (every load issued before any is used)
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
      if (first + i < rows && row_slot[first + i] >= 0) flags |= 1u << i;
    int64_t total = 0;
    int64_t rank = base + scan::exclusive_scan(__popc(flags), sm, total);
    for (; flags != 0; flags &= flags - 1, ++rank) {
      const int64_t r = first + __ffs(flags) - 1;
      routed_rows[rank] = int32_t(r);
      row_slot[r] = int32_t(rank);  // each thread rewrites only its own rows
    }
    base += total;
    __syncthreads();  // sm is rewritten by the next step's scan
  }
  if (threadIdx.x == 0) *num_routed = int32_t(base);
}

}  // namespace

void launch_routed_renumber(const TwellView& saved, cudaStream_t s) {
  launch(renumber_kernel, dim3(1), dim3(kThreads), 0, s, saved.row_slot, saved.shape.rows, saved.routed_rows,
         saved.num_routed);
  check_launch("TrainingPlan::forward", "routed-row renumber kernel");
}

}  // namespace twell::gpu
