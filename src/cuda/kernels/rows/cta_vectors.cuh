// Device code of a K-wide row owned by one CTA, shared by inference's compact_ffn.cu and
// training's compact-row passes (cta_rows.cuh): thread t owns the 16-byte vectors
// v = t + j * blockDim (j < kVecs) of K, held as fp32 [kVecs][kVecElems]; a batch of dot products
// is summed over the CTA in a fixed order (shuffles, then the warps in warp order).
#pragma once
#include <cstdint>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/warp.cuh"

namespace twell::gpu::rows {

// The thread's j-th vector of the row.
__device__ __forceinline__ int64_t thread_vector(int j) { return threadIdx.x + int64_t(j) * blockDim.x; }

// Loads the thread's vectors of a K-wide row as floats (zeros past K).
template <typename T, int kVecs>
__device__ __forceinline__ void load_row(const T* row, int64_t vectors, float (&out)[kVecs][kVecElems]) {
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t v = thread_vector(j);
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) out[j][e] = 0.0f;
    if (v < vectors) unpack8<T>(load_readonly(row + v * kVecElems), out[j]);
  }
}

// Stores the thread's vectors of a K-wide row, rounded to T.
template <typename T, int kVecs>
__device__ __forceinline__ void store_row(T* row, int64_t vectors, const float (&in)[kVecs][kVecElems]) {
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t v = thread_vector(j);
    if (v < vectors) *reinterpret_cast<uint4*>(row + v * kVecElems) = pack8<T>(in[j]);
  }
}

// Calls f(j, v) for each of the thread's vectors j whose index v is below `vectors`, in order of j.
template <int kVecs, typename F>
__device__ __forceinline__ void for_each_vector(int64_t vectors, F&& f) {
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t v = thread_vector(j);
    if (v >= vectors) continue;
    f(j, v);
  }
}

// acc += coef * w[neuron] over the thread's vectors.
template <typename T, int kVecs>
__device__ __forceinline__ void axpy_row(float coef, const T* w, int64_t vectors,
                                         float (&acc)[kVecs][kVecElems]) {
  for_each_vector<kVecs>(vectors, [&](int j, int64_t v) {
    float wf[kVecElems];
    unpack8<T>(load_readonly(w + v * kVecElems), wf);
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) acc[j][e] = fmaf(coef, wf[e], acc[j][e]);
  });
}

// The thread's part of <r, w> over its vectors.
template <typename T, int kVecs>
__device__ __forceinline__ float partial_dot(const float (&r)[kVecs][kVecElems], const T* w,
                                             int64_t vectors) {
  float dot = 0.0f;
  for_each_vector<kVecs>(vectors, [&](int j, int64_t v) {
    float wf[kVecElems];
    unpack8<T>(load_readonly(w + v * kVecElems), wf);
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) dot = fmaf(r[j][e], wf[e], dot);
  });
  return dot;
}

// Sums each dot[b] over the CTA (shuffles, then across warps in a fixed order, through
// partial[buffer]: double-buffered, one barrier per batch); every thread ends with the same totals.
// Must be reached by every thread of the CTA.
template <int kWarpSlots, int kDots>
__device__ __forceinline__ void reduce_batch(float (&dot)[kDots], float (&partial)[2][kWarpSlots][kDots],
                                             int& buffer) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int warps = blockDim.x / kWarpSize;
#pragma unroll
  for (int b = 0; b < kDots; ++b) dot[b] = warp_sum(dot[b]);
  if (warps == 1) return;
  if (lane == 0)
#pragma unroll
    for (int b = 0; b < kDots; ++b) partial[buffer][warp][b] = dot[b];
  __syncthreads();  // the other buffer is rewritten only after the next batch's barrier
#pragma unroll
  for (int b = 0; b < kDots; ++b) {
    float sum = 0.0f;
    for (int w = 0; w < warps; ++w) sum += partial[buffer][w][b];
    dot[b] = sum;
  }
  buffer ^= 1;
}

}  // namespace twell::gpu::rows
