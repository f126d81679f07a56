// The plan's device: properties read once, a scoped current-device switch, the stream rule
// (nullptr = cudaStreamPerThread) and checks that pointers are device memory of that device.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/policy/config.hpp"
#include "cuda/runtime/no_copy.hpp"
#include "twell/ffn.hpp"

namespace twell::gpu {

struct DeviceInfo {
  int index = 0;
  int sm_count = 0;   // streaming multiprocessors: sizes every persistent grid
  int cc_major = 0;
  int cc_minor = 0;
};

// Throws Error naming "weights device" for a missing device or one older than sm_80.
DeviceInfo query_device(int index, const char* op);

// Makes `index` the current device for the guard's lifetime and restores the previous one.
class DeviceGuard : NoCopy {
 public:
  DeviceGuard(int index, const char* op);
  ~DeviceGuard();

 private:
  int previous_ = -1;
  int index_ = -1;
};

// nullptr means cudaStreamPerThread, never the legacy default stream.
inline cudaStream_t resolve_stream(Stream s) {
  return s == nullptr ? cudaStreamPerThread : static_cast<cudaStream_t>(s);
}

// True when the environment variable `name` is set to anything but "" or "0" (TWELL_NO_PDL and
// the like: switches for development A/B runs).
bool env_switch_set(const char* name);

// True when kernel launches on the current device may overlap through programmatic dependent
// launch (compute capability 9.0 or newer, and TWELL_NO_PDL unset or "0"); see launch.cuh.
bool chained_launches();

// True while `s` is being captured into a CUDA graph (no allocation, query or host copy then).
bool is_capturing(cudaStream_t s, const char* op);

// Throws Error naming `name` unless p is device (or managed) memory usable on `device` and
// `align`-byte aligned: 16 for what the kernels read in 16-byte vectors (the default), 1 for
// buffers read or written element by element.
void check_device_pointer(const void* p, int device, const char* op, const char* name,
                          size_t align = ShapeLimits::kPointerAlign);

// check_device_pointer for each weight of w (16-byte aligned device memory on `device`).
void check_weight_pointers(const FfnWeights& w, int device, const char* op);
// The alignment part of check_weight_pointers alone: host arithmetic, no query.
void check_weight_alignment(const FfnWeights& w, const char* op);

// set_weights' checks for a plan's rebound weights: their alignment at once (set_weights may run
// inside a capture, where no memory query is allowed), the rest of check_weight_pointers at the
// plan's next uncaptured call.
class ReboundWeights {
 public:
  void rebound(const FfnWeights& w, const char* op) {
    check_weight_alignment(w, op);
    pending_ = true;
  }
  void before_call(const FfnWeights& w, int device, bool capturing, const char* op) {
    if (!pending_ || capturing) return;
    check_weight_pointers(w, device, op);
    pending_ = false;
  }

 private:
  bool pending_ = false;
};

}  // namespace twell::gpu
