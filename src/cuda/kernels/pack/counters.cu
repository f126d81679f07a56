// counters (int64 [2]) = {rows routed to the dense backup, non-zero gate activations}, written
// on the stream from the run's device-side RunCounters.
//   CTA / warp / thread: a single thread; two stores.
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/inference.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

__global__ void write_counters_kernel(const RunCounters* __restrict__ c, int64_t* __restrict__ out) {
  chain_entry();
  out[0] = c->num_routed;
  out[1] = static_cast<int64_t>(c->active);
}

}  // namespace

void launch_write_counters(const RunCounters* c, int64_t* counters, cudaStream_t s) {
  launch(write_counters_kernel, dim3(1), dim3(1), 0, s, c, counters);
  check_launch("InferencePlan::run", "counters kernel");
}

}  // namespace twell::gpu
