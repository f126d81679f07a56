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
// Training's saved state holds tile / 16 slots per (row, tile): it lives from forward to backward
// in every layer, and at the densities training reaches (0.5%: 1.3 entries a 256-wide tile on
// average) half of inference's slots route almost no row. A tile / 8 state costs 35 MB more per
// layer at M = 16384, N = 5632; tile / 32 routes enough rows at 1% to slow the step.
constexpr int32_t kTrainingCapacityDivisor = 16;
// Under automatic dispatch (CUDA) a step's compact state is sized to the last forward's density
// (capacity.hpp), down to tile / 64 slots by default: a trained model at 0.01% holds its rows in 4
// slots, a quarter of the state. A capacity holds kCapacityEntriesHeadroom x a tile's mean entries
// (at 16x, a Poisson count overflows fewer than 1 tile in 10^5 at capacity 4 and above). A forward
// at a capacity that routes more than M / kCapacityRoutedDivisor rows (a heavy-tailed density the
// mean does not show) raises the floor a step above it; kCapacityRetryForwards forwards at the
// raised floor that route fewer lower it a step again (a model that was denser earlier in its
// training). Uniform 0.5% or denser keeps tile / 16. Never below kTrainingMinCapacity by default:
// at 1 or 2 slots the Poisson tail at the same headroom routes percents of the rows.
constexpr int32_t kTrainingMinCapacityDivisor = 64;
constexpr int32_t kTrainingMinCapacity = 4;
constexpr int32_t kCapacityRetryForwards = 100;
constexpr double kCapacityEntriesHeadroom = 16.0;
constexpr int64_t kCapacityRoutedDivisor = 256;

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
