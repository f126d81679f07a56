// Training backward's compact rows whose dy holds a NaN or an Inf. The compact-row kernels skip a
// row's inactive neurons, which is exact only where its dy is finite: with a NaN or Inf in dy[m],
// dh[m, n] = <dy[m], Wd[n]> is not finite at every neuron, so the dense du = dh * relu(g) = dh * 0
// is NaN at the inactive ones too (gated), which makes all of dx[m] and dWu[n] NaN for every
// neuron n inactive in row m; and the dense dWd = h^T dy adds 0 * dy[m, k] = NaN at every inactive
// n where dy[m, k] is not finite. This pass writes those NaNs once every gradient is complete (the
// routed rows' products only add to them). The backward-rows kernels raise the flag when they load
// such a dy row; unless they did, every CTA exits at once.
//   CTA: one compact row at a time (grid-stride over the rows): tests its dy vectors, marks its
//        active neurons in a shared bitmap, then walks the [N, K] gradients in CTA-strided order.
#include <math_constants.h>

#include <algorithm>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/train_device.cuh"
#include "cuda/kernels/training.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/policy/train_config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

constexpr int kThreads = TrainElementwiseConfig::kThreads;
constexpr int kWordBits = 32;
constexpr int64_t kBitmapWords = ShapeLimits::kMaxIntermediate / kWordBits;  // one bit per neuron

template <typename T, FfnKind kKind>
__global__ void __launch_bounds__(kThreads) nonfinite_dy_kernel(NonFiniteDyArgs a) {
  chain_entry();
  if (*a.flag == 0) return;
  __shared__ uint32_t active[kBitmapWords];
  const TwellView& tw = a.saved;
  const int64_t n = tw.shape.cols, k = a.k, vectors = k / kVecElems;
  const int num_tiles = tiles_of(tw.shape);
  const int64_t words = (n + kWordBits - 1) / kWordBits;
  const auto* dy = static_cast<const T*>(a.dy);
  for (int64_t row = blockIdx.x; row < tw.shape.rows; row += gridDim.x) {
    if (tw.row_slot[row] >= 0) continue;  // routed: computed densely
    const T* dy_row = dy + row * k;
    bool bad = false;
    for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x)
      bad |= any_nonfinite<T>(load_readonly(dy_row + v * kVecElems));
    if (!__syncthreads_or(bad)) continue;

    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) active[w] = 0;
    __syncthreads();
    for (int t = threadIdx.x; t < num_tiles; t += blockDim.x) {
      const int64_t index = row * num_tiles + t;
      for (int e = 0; e < tw.counts[index]; ++e) {
        const int64_t neuron = int64_t(t) * tw.shape.tile + tw.cols[index * tw.shape.capacity + e];
        atomicOr(&active[neuron / kWordBits], 1u << (neuron % kWordBits));
      }
    }
    __syncthreads();
    bool some_inactive = false;
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) {
      const int64_t bits = min(int64_t(kWordBits), n - w * kWordBits);
      const uint32_t all = bits == kWordBits ? ~0u : (1u << bits) - 1u;
      some_inactive |= active[w] != all;
    }
    for (int64_t i = threadIdx.x; i < n * k; i += blockDim.x) {
      const int64_t neuron = i / k, col = i - neuron * k;
      if (active[neuron / kWordBits] >> (neuron % kWordBits) & 1u) continue;
      if constexpr (kKind == FfnKind::gated) a.dup[i] = CUDART_NAN_F;
      if (nonfinite_bits(reinterpret_cast<const uint16_t*>(dy_row)[col], Elem<T>::kInfBits))
        a.ddown[i] = CUDART_NAN_F;
    }
    if constexpr (kKind == FfnKind::gated) {
      if (__syncthreads_or(some_inactive)) {
        auto* dx_row = static_cast<uint16_t*>(a.dx) + row * k;
        for (int64_t c = threadIdx.x; c < k; c += blockDim.x) dx_row[c] = quiet_nan_bits(Elem<T>::kInfBits);
      }
    }
    __syncthreads();  // the bitmap is rewritten for the next row
  }
}

}  // namespace

void launch_nonfinite_dy(const NonFiniteDyArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const char* op = "TrainingPlan::backward";
  const int64_t rows = a.saved.shape.rows;
  if (rows == 0) return;
  const unsigned grid = unsigned(std::min<int64_t>(rows, dev.sm_count));
  with_element_type(a.saved.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    if (a.kind == FfnKind::gated)
      launch(nonfinite_dy_kernel<T, FfnKind::gated>, dim3(grid), dim3(kThreads), 0, s, a);
    else
      launch(nonfinite_dy_kernel<T, FfnKind::plain>, dim3(grid), dim3(kThreads), 0, s, a);
  });
  check_launch(op, "non-finite dy kernel");
}

}  // namespace twell::gpu
