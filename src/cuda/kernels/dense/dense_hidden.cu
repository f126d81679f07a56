// The dense path's hidden activation from G = x W1^T (before the ReLU): counts the active values
// (relu_active: positive or NaN) and forms h = relu(G) * U (gated) or h = relu(G) (plain), in place
// or into a separate buffer (training's dense path keeps G) (the product of two 16-bit values is
// exact in fp32, then rounded once, as a framework's dense layer does). The ReLU keeps NaN and the
// product is taken everywhere, relu(G) = 0 included: 0 * Inf = NaN, as in the dense layer.
//   CTA: kThreads threads over a grid-stride range of 16-byte vectors (kCtasPerSm CTAs per SM).
//        With l1_partials (training's dense form, whose statistics need sum |h|): the CTA's sum of
//        |h| (h as stored), through shuffles and a fixed-order pass over its warps, at its index.
//   warp: sums its lanes' counts; one atomic per warp.
//   thread: one vector of G (and of U) per step.
#include <algorithm>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/scan.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/inference.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

constexpr int kThreads = ElementwiseConfig::kThreads;

static_assert(kThreads % kWarpSize == 0, "whole warps: the count reduction uses every lane");

template <typename T, FfnKind kKind, bool kL1>
__global__ void __launch_bounds__(kThreads)
    dense_hidden_kernel(const T* hidden, const T* __restrict__ up, T* out, int64_t vectors,
                        unsigned long long* active, float* l1_partials) {
  chain_entry();
  unsigned long long seen = 0;
  float l1 = 0.0f;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += stride) {
    const uint4 g = *reinterpret_cast<const uint4*>(hidden + v * kVecElems);
    seen += unsigned(active_count<T>(g));
    float hf[kVecElems];
    unpack8<T>(g, hf);
    if constexpr (kKind == FfnKind::gated) {
      float uf[kVecElems];
      unpack8<T>(load_readonly(up + v * kVecElems), uf);
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) hf[e] = relu(hf[e]) * uf[e];
    } else {
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) hf[e] = relu(hf[e]);
    }
    const uint4 h = pack8<T>(hf);
    *reinterpret_cast<uint4*>(out + v * kVecElems) = h;
    if constexpr (kL1) {
      unpack8<T>(h, hf);  // |h| as stored
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) l1 += fabsf(hf[e]);
    }
  }
  warp_add_count(seen, active);
  if constexpr (kL1) {
    __shared__ float warp_l1[kThreads / kWarpSize];
    const float total = scan::cta_sum(l1, warp_l1);
    if (threadIdx.x == 0) l1_partials[blockIdx.x] = total;
  }
}

}  // namespace

int64_t launch_dense_hidden(const DenseHiddenArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const int64_t vectors = a.elements / kVecElems;
  if (vectors == 0) return 0;
  int64_t grid = std::min<int64_t>((vectors + kThreads - 1) / kThreads,
                                   int64_t(dev.sm_count) * ElementwiseConfig::kCtasPerSm);
  if (a.l1_partials != nullptr) grid = std::min<int64_t>(grid, ElementwiseConfig::kMaxPartials);
  with_element_type(a.dtype, "InferencePlan::run", [&](auto tag) {
    using T = decltype(tag);
    auto* g = static_cast<T*>(a.hidden);
    const auto* u = static_cast<const T*>(a.up);
    auto* out = a.out != nullptr ? static_cast<T*>(a.out) : g;
    const auto run = [&](auto kernel) {
      launch(kernel, dim3(unsigned(grid)), dim3(kThreads), 0, s, g, u, out, vectors, a.active, a.l1_partials);
    };
    const bool l1 = a.l1_partials != nullptr;
    if (a.kind == FfnKind::gated)
      l1 ? run(dense_hidden_kernel<T, FfnKind::gated, true>)
         : run(dense_hidden_kernel<T, FfnKind::gated, false>);
    else
      l1 ? run(dense_hidden_kernel<T, FfnKind::plain, true>)
         : run(dense_hidden_kernel<T, FfnKind::plain, false>);
  });
  check_launch("InferencePlan::run", "dense hidden kernel");
  return grid;
}

}  // namespace twell::gpu
