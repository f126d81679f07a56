// Launchers of the dense baseline's elementwise passes (training_dense_kernels.cu; the math is in
// training_dense.hpp). bf16 or fp16; buffers as in DenseStepBuffers; stream: a cudaStream_t.
// Throws twell::Error for another dtype or a failed launch.
#pragma once
#include <cstdint>

#include "twell/dtype.hpp"

namespace twell::bench {

// The L0 / L1 numerators of a dense forward (the count of non-zero relu(G), sum |h|): a step reports
// them, as twell's forward does in its stats (device memory, zeroed by the launcher).
struct DenseForwardStats {
  unsigned long long active = 0;
  float l1 = 0.0f;
};

// gu [M, 2N] = [G | U]: G <- relu(G) in place; h [M, N] = relu(G) * U; *stats as above.
void launch_dense_forward_elementwise(void* gu, void* h, int64_t m, int64_t n, DenseForwardStats* stats,
                                      DType t, void* stream);
// d [M, 2N], dh in its left half: d <- [dg | du] with t = dh + l1_over_m sign(h),
// dg = t U [G > 0], du = t relu(G); h [M, N] <- relu(G) * U (recomputed from gu).
void launch_dense_backward_elementwise(void* d, void* h, const void* gu, int64_t m, int64_t n,
                                       float l1_over_m, DType t, void* stream);

}  // namespace twell::bench
