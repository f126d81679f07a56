// Training statistics on the device: the L1 sums of the routed rows, then {L0, L1} over all rows.
//   routed L1: CTA: one routed row at a time (grid-stride over the R listed rows, grid sized for
//              R = M); thread: |h| over a strided set of the row's 16-byte vectors; the CTA sum
//              goes through shuffles and a fixed-order pass over the warps (deterministic).
//   stats:     the only CTA: thread t sums row_l1[t], row_l1[t + kThreads], ... in fp64, then the
//              same fixed-order CTA reduction; thread 0 writes {active / M, sum / M}. The dense
//              form passes its dense hidden pass's per-CTA sums instead of row_l1 (no routed pass).
#include <algorithm>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/scan.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/training.hpp"
#include "cuda/policy/train_config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

using scan::cta_sum;
constexpr int kThreads = TrainStatsConfig::kThreads;
constexpr int kWarps = kThreads / kWarpSize;

static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "whole warps within the CTA size limit");

template <typename T>
__global__ void __launch_bounds__(kThreads)
    routed_l1_kernel(const T* __restrict__ hidden, int64_t n, const int32_t* __restrict__ routed_rows,
                     const int32_t* __restrict__ num_routed, float* __restrict__ row_l1) {
  chain_entry();
  __shared__ float warp_totals[kWarps];
  const int64_t routed = *num_routed;
  const int64_t vectors = n / kVecElems;
  for (int64_t s = blockIdx.x; s < routed; s += gridDim.x) {
    const int64_t row = routed_rows[s];
    float sum = 0.0f;
    for (int64_t v = threadIdx.x; v < vectors; v += kThreads) {
      float h[kVecElems];
      unpack8<T>(load_readonly(hidden + row * n + v * kVecElems), h);
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) sum += fabsf(h[e]);
    }
    const float total = cta_sum(sum, warp_totals);
    if (threadIdx.x == 0) row_l1[row] = total;
  }
}

__global__ void __launch_bounds__(kThreads)
    stats_kernel(const float* __restrict__ sums, int64_t count, int64_t rows,
                 const unsigned long long* __restrict__ active, float* __restrict__ stats) {
  chain_entry();
  __shared__ double warp_totals[kWarps];
  double sum = 0.0;
  for (int64_t r = threadIdx.x; r < count; r += kThreads) sum += double(sums[r]);
  const double total = cta_sum(sum, warp_totals);
  if (threadIdx.x == 0) {
    stats[0] = float(double(*active) / double(rows));
    stats[1] = float(total / double(rows));
  }
}

}  // namespace

void launch_stats(const StatsArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const char* op = "TrainingPlan::forward";
  if (a.rows == 0) return;
  const int64_t sums = a.partials > 0 ? a.partials : a.rows;
  if (a.partials == 0) {  // the routed rows' sums join the compact rows' in row_l1
    const int64_t grid = std::min<int64_t>(a.rows, int64_t(dev.sm_count) * TrainStatsConfig::kCtasPerSm);
    with_element_type(a.dtype, op, [&](auto tag) {
      using T = decltype(tag);
      launch(routed_l1_kernel<T>, dim3(unsigned(grid)), dim3(kThreads), 0, s, static_cast<const T*>(a.hidden),
             a.n, a.routed_rows, a.num_routed, a.row_l1);
    });
    check_launch(op, "routed-row L1 kernel");
  }
  launch(stats_kernel, dim3(1), dim3(kThreads), 0, s, a.row_l1, sums, a.rows, a.active, a.stats);
  check_launch(op, "statistics kernel");
}

}  // namespace twell::gpu
