#include "cuda/runtime/device.hpp"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

DeviceInfo query_device(int index, const char* op) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(op, "weights device", "a CUDA device", std::string("none (") + cudaGetErrorString(e) + ")");
  }
  if (index < 0 || index >= count)
    throw Error(op, "weights device", "a CUDA device index below " + std::to_string(count),
                "cuda:" + std::to_string(index));
  DeviceInfo d;
  d.index = index;
  check_cuda(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, index), op,
             "multiprocessor count");
  check_cuda(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, index), op,
             "compute capability");
  check_cuda(cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, index), op,
             "compute capability");
  if (d.cc_major < ShapeLimits::kMinComputeMajor)
    throw Error(op, "weights device",
                "compute capability " + std::to_string(ShapeLimits::kMinComputeMajor) + ".0 or newer",
                std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor));
  return d;
}

DeviceGuard::DeviceGuard(int index, const char* op) : index_(index) {
  check_cuda(cudaGetDevice(&previous_), op, "current device");
  if (previous_ != index_) check_cuda(cudaSetDevice(index_), op, "current device");
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != index_) cudaSetDevice(previous_);
}

bool env_switch_set(const char* name) {
  const char* v = std::getenv(name);
  return !(v == nullptr || v[0] == '\0' || (v[0] == '0' && v[1] == '\0'));
}

bool chained_launches() {
  static const bool allowed = !env_switch_set("TWELL_NO_PDL");
  if (!allowed) return false;
  // Per device: 0 unknown, 1 no, 2 yes.
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  int state = device < kMaxDevices ? known[device].load(std::memory_order_relaxed) : 0;
  if (state == 0) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      major = 0;
    }
    state = major >= 9 ? 2 : 1;
    if (device < kMaxDevices) known[device].store(state, std::memory_order_relaxed);
  }
  return state == 2;
}

bool is_capturing(cudaStream_t s, const char* op) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(s, &status), op, "stream capture status");
  return status != cudaStreamCaptureStatusNone;
}

void check_device_pointer(const void* p, int device, const char* op, const char* name, size_t align) {
  const std::string want = "device memory on cuda:" + std::to_string(device);
  cudaPointerAttributes a{};
  check_cuda(cudaPointerGetAttributes(&a, p), op, name);
  if (a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost)
    throw Error(op, name, want, "host memory");
  if (a.type == cudaMemoryTypeDevice && a.device != device)
    throw Error(op, name, want, "memory on cuda:" + std::to_string(a.device));
  if (reinterpret_cast<uintptr_t>(p) % align != 0)
    throw Error(op, name, std::to_string(align) + "-byte aligned data",
                "address " + std::to_string(reinterpret_cast<uintptr_t>(p)));
}

void check_weight_alignment(const FfnWeights& w, const char* op) {
  const auto aligned = [op](const void* p, const char* name) {
    if (reinterpret_cast<uintptr_t>(p) % ShapeLimits::kPointerAlign != 0)
      throw Error(op, name, std::to_string(ShapeLimits::kPointerAlign) + "-byte aligned data",
                  "address " + std::to_string(reinterpret_cast<uintptr_t>(p)));
  };
  if (w.kind == FfnKind::gated) aligned(w.gate.data, "gate weight");
  aligned(w.up.data, "up weight");
  aligned(w.down.data, "down weight");
}

void check_weight_pointers(const FfnWeights& w, int device, const char* op) {
  if (w.kind == FfnKind::gated) check_device_pointer(w.gate.data, device, op, "gate weight");
  check_device_pointer(w.up.data, device, op, "up weight");
  check_device_pointer(w.down.data, device, op, "down weight");
}

}  // namespace twell::gpu
