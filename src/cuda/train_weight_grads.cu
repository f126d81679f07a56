// Weight gradients of the compact entries, per neuron over the column index (written, not
// accumulated; the routed rows' dense contribution is added afterwards):
//   dWd[n] = sum h dy[m];  dW1[n] = sum dg x[m];  dWu[n] = sum du x[m] (gated)
// with h = g*u, dg = dh*u, du = dh*g (gated) or h = g, dg = dh (plain), fp32 accumulation.
//   CTA: one neuron (blockIdx.x) and a 256-column slice of K (blockIdx.y); its kWarps warps split
//        the neuron's entries into contiguous runs (a neuron firing for many tokens is walked
//        kWarps ways at once); the warps' sums meet in shared memory in warp order: deterministic.
//   warp: 32 entries' coefficients loaded at once (one per lane), then their x / dy vectors
//         kBatch entries at a time (loads first, to keep several in flight).
//   thread: 8 consecutive columns of the slice: the fp32 accumulators of every gradient.
#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/element.cuh"
#include "cuda/train_config.hpp"
#include "cuda/train_kernels.hpp"
#include "cuda/train_device.cuh"

namespace twell::gpu {

namespace {

using Cfg = WeightGradConfig;
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kBatch = Cfg::kBatch;
constexpr int kSlice = kWarpSize * kVecElems;  // columns of K per CTA
constexpr int kThreads = Cfg::kWarps * kWarpSize;
static_assert(kThreads == kSlice, "the final sum gives each thread one column of the slice");
static_assert(kWarpSize % kBatch == 0, "batches tile a group of 32 entries");

template <typename T, FfnKind kKind>
__global__ void __launch_bounds__(kThreads)
    weight_grads_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                        const float* __restrict__ dh, const int64_t* __restrict__ col_ptr,
                        const int64_t* __restrict__ entries, float* __restrict__ dfirst,
                        float* __restrict__ dup, float* __restrict__ ddown, int64_t k, TwellView tw) {
  constexpr bool kGated = kKind == FfnKind::gated;
  constexpr int kGrads = kGated ? 3 : 2;
  __shared__ float partial[Cfg::kWarps][kGrads][kSlice];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t n = blockIdx.x;
  const int64_t col = int64_t(blockIdx.y) * kSlice + lane * kVecElems;  // this lane's 8 columns
  const bool in_k = col < k;
  const auto* values = static_cast<const T*>(tw.values);
  const T* plane1 = values + plane_elements(tw.shape);
  const int64_t slots_per_row = int64_t(tiles_of(tw.shape)) * tw.shape.capacity;

  float acc[kGrads][kVecElems];  // first, down, up
#pragma unroll
  for (int q = 0; q < kGrads; ++q)
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) acc[q][e] = 0.0f;

  // This warp's contiguous run of the neuron's entries.
  const int64_t begin = col_ptr[n], count = col_ptr[n + 1] - begin;
  const int64_t per_warp = (count + Cfg::kWarps - 1) / Cfg::kWarps;
  const int64_t lo = begin + min(count, per_warp * warp), hi = begin + min(count, per_warp * (warp + 1));
  for (int64_t j0 = lo; j0 < hi; j0 += kWarpSize) {
    // Lane l: entry j0 + l's row and coefficients.
    int64_t row = 0;
    float c_first = 0.0f, c_up = 0.0f, c_down = 0.0f;
    if (j0 + lane < hi) {
      const int64_t pos = entries[j0 + lane];
      row = pos / slots_per_row;
      const float g = Elem<T>::to_float(values[pos]);
      const float u = kGated ? Elem<T>::to_float(plane1[pos]) : 1.0f;
      const float d = dh[pos];
      c_first = d * u;
      c_up = d * g;
      c_down = g * u;
    }
    const int group = int(hi - j0 < kWarpSize ? hi - j0 : kWarpSize);
    for (int b0 = 0; b0 < group; b0 += kBatch) {
      uint4 xv[kBatch], dyv[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t r = __shfl_sync(kFullMask, row, b0 + b);
        xv[b] = dyv[b] = make_uint4(0, 0, 0, 0);
        if (in_k && b0 + b < group) {
          xv[b] = load_readonly(x + r * k + col);
          dyv[b] = load_readonly(dy + r * k + col);
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const float cf = __shfl_sync(kFullMask, c_first, b0 + b);
        const float cu = __shfl_sync(kFullMask, c_up, b0 + b);
        const float cd = __shfl_sync(kFullMask, c_down, b0 + b);
        if (b0 + b >= group) continue;
        float xf[kVecElems], dyf[kVecElems];
        unpack8<T>(xv[b], xf);
        unpack8<T>(dyv[b], dyf);
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) {
          acc[0][e] = fmaf(cf, xf[e], acc[0][e]);
          acc[1][e] = fmaf(cd, dyf[e], acc[1][e]);
          if constexpr (kGated) acc[2][e] = fmaf(cu, xf[e], acc[2][e]);
        }
      }
    }
  }

#pragma unroll
  for (int q = 0; q < kGrads; ++q)
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) partial[warp][q][lane * kVecElems + e] = acc[q][e];
  __syncthreads();
  const int64_t c = int64_t(blockIdx.y) * kSlice + threadIdx.x;
  if (c >= k) return;
  float* outs[3] = {dfirst, ddown, dup};
#pragma unroll
  for (int q = 0; q < kGrads; ++q) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) sum += partial[w][q][threadIdx.x];
    outs[q][n * k + c] = sum;
  }
}

}  // namespace

void launch_weight_grads(const WeightGradArgs& a, cudaStream_t s) {
  const char* op = "TrainingPlan::backward";
  const int64_t n = a.saved.shape.cols;
  if (a.k == 0 || n == 0) return;
  const dim3 grid(unsigned(n), unsigned((a.k + kSlice - 1) / kSlice));
  with_element_type(a.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    const auto* x = static_cast<const T*>(a.x);
    const auto* dy = static_cast<const T*>(a.dy);
    if (a.kind == FfnKind::gated)
      weight_grads_kernel<T, FfnKind::gated><<<grid, kThreads, 0, s>>>(
          x, dy, a.dh, a.col_ptr, a.entries, a.dfirst, a.dup, a.ddown, a.k, a.saved);
    else
      weight_grads_kernel<T, FfnKind::plain><<<grid, kThreads, 0, s>>>(
          x, dy, a.dh, a.col_ptr, a.entries, a.dfirst, a.dup, a.ddown, a.k, a.saved);
  });
  check_launch(op, "weight gradient kernel");
}

}  // namespace twell::gpu
