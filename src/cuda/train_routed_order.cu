// The routed rows in ascending order: the dense reductions over routed rows (weight gradients)
// then add them in an order that does not depend on the atomics that listed them in forward.
//   CTA: the only one; it walks the rows kThreads at a time, carrying the running count.
//   warp: part of the CTA-wide exclusive scan of the routed flags.
//   thread: one row per step: flag, rank, and the write of its position.
#include "cuda/cuda_check.hpp"
#include "cuda/train_config.hpp"
#include "cuda/train_kernels.hpp"
#include "cuda/train_scan.cuh"

namespace twell::gpu {

namespace {

constexpr int kThreads = RoutedOrderConfig::kThreads;
static_assert(kThreads % scan::kWarpSize == 0 && kThreads <= 1024, "whole warps within the CTA limit");

__global__ void __launch_bounds__(kThreads)
    routed_order_kernel(int32_t* row_slot, int64_t rows, int32_t* __restrict__ order,
                        int32_t* __restrict__ count, bool renumber) {
  __shared__ scan::ScanShared sm;
  int64_t base = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += kThreads) {
    const int64_t r = r0 + threadIdx.x;
    const bool routed = r < rows && row_slot[r] >= 0;
    int64_t total = 0;
    const int64_t rank = scan::exclusive_scan(routed ? 1 : 0, sm, total);
    if (routed) {
      order[base + rank] = int32_t(r);
      if (renumber) row_slot[r] = int32_t(base + rank);  // each thread rewrites only its own row
    }
    base += total;
    __syncthreads();  // sm is rewritten by the next step's scan
  }
  if (threadIdx.x == 0) *count = int32_t(base);
}

}  // namespace

void launch_routed_order(const int32_t* row_slot, int64_t rows, int32_t* order, int32_t* count,
                         cudaStream_t s) {
  routed_order_kernel<<<1, kThreads, 0, s>>>(const_cast<int32_t*>(row_slot), rows, order, count, false);
  check_launch("TrainingPlan::backward", "routed-row order kernel");
}

void launch_routed_renumber(const TwellView& saved, cudaStream_t s) {
  routed_order_kernel<<<1, kThreads, 0, s>>>(saved.row_slot, saved.shape.rows, saved.routed_rows,
                                             saved.num_routed, true);
  check_launch("TrainingPlan::forward", "routed-row order kernel");
}

}  // namespace twell::gpu
