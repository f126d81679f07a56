// CTA-wide reductions. exclusive_scan: a prefix sum of one int64 per thread (integer, so the order
// of the additions does not matter): warp shuffles, then the warp totals scanned by warp 0.
// cta_sum: a sum of one float or double per thread in a fixed order (shuffles, then the warp totals
// in warp order), so a run gives the same bits every time.
#pragma once
#include <cstdint>

#include "cuda/kernels/common/warp.cuh"

namespace twell::gpu::scan {

struct ScanShared {
  int64_t warp_offset[kWarpSize];  // exclusive prefix of each warp's total
  int64_t total;                   // the CTA's total
};

// Returns the sum of v over the threads below this one and sets `total` to the sum over the CTA.
// Every thread of the CTA (whole warps) must call it; the caller synchronises before reusing `sm`.
__device__ __forceinline__ int64_t exclusive_scan(int64_t v, ScanShared& sm, int64_t& total) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  int64_t inclusive = v;
#pragma unroll
  for (int d = 1; d < kWarpSize; d <<= 1) {
    const int64_t below = __shfl_up_sync(kFullMask, inclusive, d);
    if (lane >= d) inclusive += below;
  }
  if (lane == kWarpSize - 1) sm.warp_offset[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int64_t mine = lane < warps ? sm.warp_offset[lane] : 0;
    int64_t running = mine;
#pragma unroll
    for (int d = 1; d < kWarpSize; d <<= 1) {
      const int64_t below = __shfl_up_sync(kFullMask, running, d);
      if (lane >= d) running += below;
    }
    if (lane < warps) sm.warp_offset[lane] = running - mine;
    if (lane == kWarpSize - 1) sm.total = running;
  }
  __syncthreads();
  total = sm.total;
  return sm.warp_offset[warp] + inclusive - v;
}

// The CTA-wide sum of v, valid in thread 0 (kWarps = the CTA's warps); every thread must call it.
template <typename F, int kWarps>
__device__ __forceinline__ F cta_sum(F v, F (&warp_totals)[kWarps]) {
  v = warp_sum(v);
  if (threadIdx.x % kWarpSize == 0) warp_totals[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  F total = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kWarps; ++w) total += warp_totals[w];
  __syncthreads();  // warp_totals may be rewritten by the caller's next call
  return total;
}

}  // namespace twell::gpu::scan
