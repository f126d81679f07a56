// What both CUDA plans share around their kernels: the order of runs across streams and the
// plan-owned workspace they run in when the caller passes none.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/runtime/no_copy.hpp"

namespace twell::gpu {

// A device buffer that grows on demand with stream-ordered allocation.
class OwnedWorkspace : NoCopy {
 public:
  OwnedWorkspace() = default;
  ~OwnedWorkspace();

  // At least `bytes` on the current device. Growing frees the old buffer on s after `after` (the
  // previous run's completion event), so no run still in flight loses its memory. Growing while
  // s is being captured raises Error: run once outside the capture, or pass a workspace. `op`
  // names the caller in errors.
  void* reserve(size_t bytes, cudaStream_t s, cudaEvent_t after, bool capturing, const char* op);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Runs of one plan share its workspace and calibration state; runs on different streams are
// ordered by an event recorded at the end of each uncaptured run. Captured runs neither wait nor
// record (the graph's own edges order them).
class RunOrder : NoCopy {
 public:
  explicit RunOrder(const char* op);  // op: the plan, in errors
  ~RunOrder();

  // Before a run's first work on s: wait for the previous uncaptured run if it was on another stream.
  void begin(cudaStream_t s, bool capturing, const char* op);
  // After a run's last work on s.
  void end(cudaStream_t s, bool capturing, const char* op);
  // The plan's own workspace of at least `bytes`, grown after the previous run (OwnedWorkspace).
  void* own_workspace(size_t bytes, cudaStream_t s, bool capturing, const char* op);

 private:
  OwnedWorkspace own_;
  cudaEvent_t done_ = nullptr;          // recorded at the end of every uncaptured run
  cudaStream_t last_stream_ = nullptr;  // the stream of the last uncaptured run
};

}  // namespace twell::gpu
