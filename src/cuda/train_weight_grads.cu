// Weight gradients of the compact entries, per neuron over the column index (written, not
// accumulated; the routed rows' dense contribution is added afterwards):
//   dWd[n] = sum h dy[m];  dW1[n] = sum dg x[m];  dWu[n] = sum du x[m] (gated)
// with h = g*u, dg = dh*u, du = dh*g (gated) or h = g, dg = dh (plain), entries in ascending row
// order and fp32 accumulation: deterministic.
//   CTA: one neuron (blockIdx.x) and a slice of blockDim 16-byte vectors of K (blockIdx.y).
//   warp: 32 consecutive vectors of that slice; every lane walks the same entries.
//   thread: one 16-byte vector of K: its fp32 accumulators of every gradient; x and dy vectors of
//           kBatch entries are loaded before they are used, to keep several loads in flight.
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
constexpr int kBatch = Cfg::kBatch;

static_assert(Cfg::kMaxThreads % kWarpSize == 0 && Cfg::kMaxThreads <= 1024,
              "whole warps within the CTA size limit");

__device__ __forceinline__ void store8(float* dst, const float (&v)[kVecElems]) {
  auto* d = reinterpret_cast<float4*>(dst);
  d[0] = make_float4(v[0], v[1], v[2], v[3]);
  d[1] = make_float4(v[4], v[5], v[6], v[7]);
}

template <typename T, FfnKind kKind>
__global__ void __launch_bounds__(Cfg::kMaxThreads)
    weight_grads_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                        const float* __restrict__ dh, const int64_t* __restrict__ col_ptr,
                        const int64_t* __restrict__ entries, float* __restrict__ dfirst,
                        float* __restrict__ dup, float* __restrict__ ddown, int64_t k, TwellView tw) {
  constexpr bool kGated = kKind == FfnKind::gated;
  const int64_t n = blockIdx.x;
  const int64_t v = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (v >= k / kVecElems) return;
  const auto* values = static_cast<const T*>(tw.values);
  const T* plane1 = values + plane_elements(tw.shape);
  const int64_t slots_per_row = int64_t(tiles_of(tw.shape)) * tw.shape.capacity;

  float acc_first[kVecElems], acc_up[kVecElems], acc_down[kVecElems];
#pragma unroll
  for (int e = 0; e < kVecElems; ++e) acc_first[e] = acc_up[e] = acc_down[e] = 0.0f;

  const int64_t end = col_ptr[n + 1];
  for (int64_t j0 = col_ptr[n]; j0 < end; j0 += kBatch) {
    float c_first[kBatch], c_up[kBatch], c_down[kBatch];
    uint4 xv[kBatch], dyv[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      c_first[b] = c_up[b] = c_down[b] = 0.0f;
      xv[b] = dyv[b] = make_uint4(0, 0, 0, 0);
      if (j0 + b >= end) continue;
      const int64_t pos = entries[j0 + b];
      const int64_t row = pos / slots_per_row;
      const float g = Elem<T>::to_float(values[pos]);
      const float u = kGated ? Elem<T>::to_float(plane1[pos]) : 1.0f;
      const float d = dh[pos];
      c_first[b] = d * u;
      c_up[b] = d * g;
      c_down[b] = g * u;
      xv[b] = load_readonly(x + row * k + v * kVecElems);
      dyv[b] = load_readonly(dy + row * k + v * kVecElems);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (j0 + b >= end) continue;
      float xf[kVecElems], dyf[kVecElems];
      unpack8<T>(xv[b], xf);
      unpack8<T>(dyv[b], dyf);
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) {
        acc_first[e] = fmaf(c_first[b], xf[e], acc_first[e]);
        if constexpr (kGated) acc_up[e] = fmaf(c_up[b], xf[e], acc_up[e]);
        acc_down[e] = fmaf(c_down[b], dyf[e], acc_down[e]);
      }
    }
  }

  const int64_t at = n * k + v * kVecElems;
  store8(dfirst + at, acc_first);
  if constexpr (kGated) store8(dup + at, acc_up);
  store8(ddown + at, acc_down);
}

}  // namespace

void launch_weight_grads(const WeightGradArgs& a, cudaStream_t s) {
  const char* op = "TrainingPlan::backward";
  const int64_t vectors = a.k / kVecElems;
  const int64_t n = a.saved.shape.cols;
  if (vectors == 0 || n == 0) return;
  const int threads =
      int(std::min<int64_t>(Cfg::kMaxThreads, (vectors + kWarpSize - 1) / kWarpSize * kWarpSize));
  const dim3 grid(unsigned(n), unsigned((vectors + threads - 1) / threads));
  with_element_type(a.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    const auto* x = static_cast<const T*>(a.x);
    const auto* dy = static_cast<const T*>(a.dy);
    if (a.kind == FfnKind::gated)
      weight_grads_kernel<T, FfnKind::gated><<<grid, threads, 0, s>>>(
          x, dy, a.dh, a.col_ptr, a.entries, a.dfirst, a.dup, a.ddown, a.k, a.saved);
    else
      weight_grads_kernel<T, FfnKind::plain><<<grid, threads, 0, s>>>(
          x, dy, a.dh, a.col_ptr, a.entries, a.dfirst, a.dup, a.ddown, a.k, a.saved);
  });
  check_launch(op, "weight gradient kernel");
}

}  // namespace twell::gpu
