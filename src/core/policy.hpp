// Dispatch defaults of both backends, in one place: what an option left at 0 or < 0 becomes. The
// CUDA kernels' launch shapes and tuned thresholds are in src/cuda/policy/ (config.hpp,
// train_config.hpp, calibration.hpp); python/twell/layout.py mirrors the tile defaults (checked
// against the plans at run time).
#pragma once
#include <cstdint>

namespace twell::detail::policy {

// Both backends pack 256-wide tiles (on the GPU one gate-GEMM output tile), with tile / 8 slots.
constexpr int32_t kDefaultTile = 256;
constexpr int32_t kDefaultCapacityDivisor = 8;

// Density (fraction of N) above which automatic dispatch runs dense.
// CPU: at M = 256 the sparse stage costs ~1 us per active (row, neuron) streaming weight rows from
// DRAM, the dense up and down ~63 ms, so they cross at ~4.4% (bench/results/cpu).
constexpr double kCpuDenseAbove = 0.035;
// CUDA: below this, dispatch times both paths per regime and keeps the faster (calibration.hpp);
// above it, sparse is not tried: one gate GEMM plus 4 KB of L2 reads per active neuron and token
// cannot beat the tensor cores' dense GEMMs there (docs/kernels.md).
constexpr double kCudaDenseAbove = 0.04;
// CUDA training: the compact form below, the dense form above (the same crossing).
constexpr double kCudaTrainingDenseAbove = 0.04;

}  // namespace twell::detail::policy
