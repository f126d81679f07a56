// Automatic dispatch without a host synchronisation: each eager run copies its device counters
// into pinned memory behind an event; a later run polls the event (never waits) and compares the
// last completed measurement's density with the plan's dense_above.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels.hpp"

namespace twell::gpu {

class DensityCalibration {
 public:
  DensityCalibration();
  ~DensityCalibration();
  DensityCalibration(const DensityCalibration&) = delete;
  DensityCalibration& operator=(const DensityCalibration&) = delete;

  // True when the last completed measurement exceeded dense_above (false before any: sparse).
  // While capturing, the event is not polled (a graph keeps the decision made at capture).
  bool prefer_dense(double dense_above, bool capturing);
  // Enqueues the copy of this run's counters (rows x cols gate activations) on s.
  void measure(const RunCounters* device_counters, int64_t rows, int64_t cols, cudaStream_t s);

 private:
  RunCounters* host_ = nullptr;  // pinned
  cudaEvent_t ready_ = nullptr;
  bool pending_ = false;
  double elements_ = 0;  // rows * cols of the pending measurement
  double density_ = 0;   // active / elements of the last completed one
};

}  // namespace twell::gpu
