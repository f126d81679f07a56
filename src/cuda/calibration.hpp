// Automatic dispatch without a host synchronisation. Each eager run copies its device counters
// into pinned memory behind an event and is timed with a pair of events; a later run polls them
// (never waits). For every regime (M rounded to a power of two, density to a factor of ~1.4) the
// first runs try each path twice (a first run also carries one-time host work, e.g. cuBLASLt's
// algorithm choice, between its events), then the path with the smaller best time runs. Densities above the plan's dense_above
// run dense without a trial. A captured graph keeps the decision made at capture.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <utility>

#include "cuda/kernels.hpp"

namespace twell::gpu {

class DispatchCalibration {
 public:
  DispatchCalibration();
  ~DispatchCalibration();
  DispatchCalibration(const DispatchCalibration&) = delete;
  DispatchCalibration& operator=(const DispatchCalibration&) = delete;

  // The path for a run of `rows` rows (true: dense). Before any density is known: sparse.
  bool prefer_dense(int64_t rows, double dense_above, bool capturing);
  // Brackets an eager run: start() before its first kernel, finish() after its last.
  void start(cudaStream_t s);
  void finish(const RunCounters* device_counters, int64_t rows, int64_t cols, bool dense,
              cudaStream_t s);

 private:
  using Regime = std::pair<int, int>;  // (log2 rows, density bucket)
  static constexpr int kTrials = 2;  // timed runs of each path before choosing
  struct Times {
    float best_ms[2] = {0, 0};  // per path (0 sparse, 1 dense): fastest measured
    int runs[2] = {0, 0};
  };
  void poll();
  Regime regime(int64_t rows) const;

  RunCounters* host_ = nullptr;  // pinned
  cudaEvent_t begin_ = nullptr, end_ = nullptr;  // the run, timed
  cudaEvent_t copied_ = nullptr;                   // its counters are in host_
  bool pending_ = false, pending_dense_ = false, started_ = false;
  double pending_elements_ = 0;
  int64_t pending_rows_ = 0;
  double density_ = -1;  // active / (rows * cols) of the last completed run; -1: none yet
  std::map<Regime, Times> times_;
};

}  // namespace twell::gpu
