// The elementwise backward of the R routed rows (their g = x W1^T, u and dh recomputed densely,
// g before the ReLU), in place:
//   gated: p = g -> h = relu(g) * u;  q = [u | dh] -> [dg | du],  dh' = dh + l1 * sign(h) / M,
//          dg = dh' * u where g is active (else 0), du = dh' * relu(g)
//   plain: p = g -> h = relu(g);  q = dh -> dg = dh + l1 * sign(h) / M where g is active (else 0)
// every value rounded to the dtype once (the GEMMs that consume them read 16-bit operands). As in
// the dense layer: relu keeps NaN and is active there (relu_active), h and du are products even
// where relu(g) = 0 (0 * Inf = NaN), dg a select, and sign(NaN) = 0.
//   CTA: kThreads threads over a grid-stride range of 16-byte vectors of the chunk's rows of
//        [R, N]; R read on the device (the grid is sized for R = M; CTAs past R*N exit).
//   warp / thread: one vector of p (and the matching vectors of q) per step.
#include <algorithm>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/train_device.cuh"
#include "cuda/kernels/training.hpp"
#include "cuda/policy/train_config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

constexpr int kThreads = TrainElementwiseConfig::kThreads;

template <typename T, FfnKind kKind>
__global__ void __launch_bounds__(kThreads)
    routed_hidden_kernel(T* __restrict__ p, T* __restrict__ q, int64_t n, int64_t rows, L1Coef l1,
                         const int32_t* __restrict__ count, RoutedChunk chunk) {
  chain_entry();
  const int64_t row_vectors = n / kVecElems;
  const int64_t vectors = max(int64_t(0), min(int64_t(*count), chunk.end) - chunk.base) * row_vectors;
  const float scale = l1_scale(l1, rows);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += stride) {
    const int64_t s = v / row_vectors;
    const int64_t c = (v % row_vectors) * kVecElems;
    T* pv = p + s * n + c;
    float g[kVecElems], a[kVecElems];
    unpack8<T>(*reinterpret_cast<const uint4*>(pv), g);
    if constexpr (kKind == FfnKind::gated) {
      T* uv = q + s * 2 * n + c;  // u, then dg
      T* dv = uv + n;             // dh, then du
      float u[kVecElems], h[kVecElems], du[kVecElems];
      unpack8<T>(*reinterpret_cast<const uint4*>(uv), u);
      unpack8<T>(*reinterpret_cast<const uint4*>(dv), a);
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) {
        h[e] = relu(g[e]) * u[e];
        const float dh = a[e] + scale * sign_of(h[e]);
        a[e] = relu_active(g[e]) ? dh * u[e] : 0.0f;
        du[e] = dh * relu(g[e]);
      }
      *reinterpret_cast<uint4*>(pv) = pack8<T>(h);
      *reinterpret_cast<uint4*>(uv) = pack8<T>(a);
      *reinterpret_cast<uint4*>(dv) = pack8<T>(du);
    } else {
      T* dv = q + s * n + c;  // dh, then dg
      unpack8<T>(*reinterpret_cast<const uint4*>(dv), a);
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) {
        a[e] = relu_active(g[e]) ? a[e] + scale * sign_of(g[e]) : 0.0f;
        g[e] = relu(g[e]);
      }
      *reinterpret_cast<uint4*>(pv) = pack8<T>(g);
      *reinterpret_cast<uint4*>(dv) = pack8<T>(a);
    }
  }
}

}  // namespace

void launch_routed_hidden(const RoutedHiddenArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const char* op = "TrainingPlan::backward";
  const HiddenGradProblem& pr = a.problem;
  const int64_t vectors = (std::min(pr.rows, a.chunk.end) - a.chunk.base) * (pr.n / kVecElems);
  if (vectors == 0) return;
  const int64_t grid = std::min<int64_t>((vectors + kThreads - 1) / kThreads,
                                         int64_t(dev.sm_count) * TrainElementwiseConfig::kCtasPerSm);
  with_element_type(pr.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    auto* p = static_cast<T*>(a.p);
    auto* q = static_cast<T*>(a.q);
    if (pr.kind == FfnKind::gated)
      launch(routed_hidden_kernel<T, FfnKind::gated>, dim3(unsigned(grid)), dim3(kThreads), 0, s, p, q, pr.n,
             pr.rows, pr.l1, a.count, a.chunk);
    else
      launch(routed_hidden_kernel<T, FfnKind::plain>, dim3(unsigned(grid)), dim3(kThreads), 0, s, p, q, pr.n,
             pr.rows, pr.l1, a.count, a.chunk);
  });
  check_launch(op, "routed hidden kernel");
}

}  // namespace twell::gpu
