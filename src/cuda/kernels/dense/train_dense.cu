// Training's dense path (early-training densities): the saved layout with every row routed and
// its dense planes in the backup rows, and the elementwise backward of the hidden layer.
//   layout:   row_slot[m] = routed_rows[m] = m, *num_routed = M (grid-stride over rows).
//   backward: per element of [M, N], with G (gated: x Wg^T before the ReLU; plain: relu(x Wu^T),
//             which the forward's dense hidden pass wrote), u = U from the backup planes and dh
//             from the dh GEMM: g = relu(G), t = dh + l1 * sign(h) / M;  gated: dg = t u [G active],
//             du = t g into q = [dg | du] (row width 2N), h = g u (over dh: each thread reads its dh
//             vector before writing its h vector there);  plain: dg = t [G active] into q (width N).
//             Each value rounded once to the dtype, as a framework's dense layer stores them. NaN
//             as in the dense layer: relu(NaN) = NaN is active, h and du are products (0 * Inf =
//             NaN), dg a select, sign(NaN) = 0.
//   CTA: kThreads threads over a grid-stride range of 16-byte vectors (kCtasPerSm CTAs per SM).
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

__global__ void __launch_bounds__(kThreads) dense_layout_kernel(TwellView tw) {
  chain_entry();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < tw.shape.rows; r += stride) {
    tw.row_slot[r] = int32_t(r);
    tw.routed_rows[r] = int32_t(r);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *tw.num_routed = int32_t(tw.shape.rows);
}

template <typename T, FfnKind kKind>
__global__ void __launch_bounds__(kThreads)
    dense_backward_kernel(const T* __restrict__ g, const T* __restrict__ u, const T* dh,
                          T* __restrict__ q, T* h, int64_t n, int64_t vectors, L1Coef l1,
                          int64_t rows) {
  chain_entry();
  constexpr bool kGated = kKind == FfnKind::gated;
  const float scale = l1_scale(l1, rows);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += stride) {
    const int64_t i = v * kVecElems, row = i / n, col = i - row * n;
    float gf[kVecElems], uf[kVecElems], df[kVecElems];
    unpack8<T>(load_readonly(g + i), gf);
    unpack8<T>(*reinterpret_cast<const uint4*>(dh + i), df);  // h may overwrite dh: a coherent load
    if constexpr (kGated) unpack8<T>(load_readonly(u + i), uf);
    float dg[kVecElems], du[kVecElems], hf[kVecElems];
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) {
      const float ue = kGated ? uf[e] : 1.0f;
      const float ge = relu(gf[e]);
      hf[e] = ge * ue;
      const float t = df[e] + scale * sign_of(hf[e]);
      dg[e] = relu_active(gf[e]) ? t * ue : 0.0f;
      du[e] = t * ge;
    }
    T* qrow = q + row * (kGated ? 2 * n : n);
    *reinterpret_cast<uint4*>(qrow + col) = pack8<T>(dg);
    if constexpr (kGated) {
      *reinterpret_cast<uint4*>(qrow + n + col) = pack8<T>(du);
      *reinterpret_cast<uint4*>(h + i) = pack8<T>(hf);
    }
  }
}

int64_t grid_for(int64_t items, const DeviceInfo& dev) {
  return std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads,
                                                int64_t(dev.sm_count) * TrainElementwiseConfig::kCtasPerSm));
}

}  // namespace

void launch_dense_layout(const TwellView& saved, const DeviceInfo& dev, cudaStream_t s) {
  const char* op = "TrainingPlan::forward";
  const size_t counts = size_t(saved.shape.rows) * size_t(saved.shape.num_tiles()) * sizeof(uint16_t);
  check_cuda(cudaMemsetAsync(saved.counts, 0, counts, s), op, "saved counts");
  launch(dense_layout_kernel, dim3(unsigned(grid_for(saved.shape.rows, dev))), dim3(kThreads), 0, s, saved);
  check_launch(op, "dense layout kernel");
}

void launch_dense_backward_hidden(const DenseBackwardArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const char* op = "TrainingPlan::backward";
  const HiddenGradProblem& pr = a.problem;
  const int64_t vectors = pr.rows * pr.n / kVecElems;
  if (vectors == 0) return;
  with_element_type(pr.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    const auto args = [&](auto kernel) {
      launch(kernel, dim3(unsigned(grid_for(vectors, dev))), dim3(kThreads), 0, s, static_cast<const T*>(a.g),
             static_cast<const T*>(a.u), static_cast<const T*>(a.dh), static_cast<T*>(a.q),
             static_cast<T*>(a.h), pr.n, vectors, pr.l1, pr.rows);
    };
    if (pr.kind == FfnKind::gated)
      args(dense_backward_kernel<T, FfnKind::gated>);
    else
      args(dense_backward_kernel<T, FfnKind::plain>);
  });
  check_launch(op, "dense backward hidden kernel");
}

}  // namespace twell::gpu
