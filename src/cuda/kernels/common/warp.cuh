// The warp, as every kernel of the backend uses it: 32 lanes, all taking part in each shuffle and
// ballot (no kernel runs a partial warp through one). The sums are butterflies: every lane adds in
// the same order, so every lane holds the same bits, and a rerun gives them again.
#pragma once

namespace twell::gpu {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;  // every lane of the warp

#ifdef __CUDACC__
// The sum of v over the warp, in every lane.
template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
  for (int d = kWarpSize / 2; d > 0; d >>= 1) v += __shfl_xor_sync(kFullMask, v, d);
  return v;
}

// Each v[i] summed over the warp, in every lane (the n butterflies interleaved, step by step).
template <typename V, int kN>
__device__ __forceinline__ void warp_sums(V (&v)[kN]) {
#pragma unroll
  for (int d = kWarpSize / 2; d > 0; d >>= 1)
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] += __shfl_xor_sync(kFullMask, v[i], d);
}

// Adds the warp's count (each lane's `seen`) to *total, one atomic from lane 0 and none for 0.
__device__ __forceinline__ void warp_add_count(unsigned long long seen, unsigned long long* total) {
  seen = warp_sum(seen);
  if (threadIdx.x % kWarpSize == 0 && seen != 0) atomicAdd(total, seen);
}
#endif

}  // namespace twell::gpu
