// Shared by the CUDA benchmark runners: errors as twell::Error, device buffers, and the timing rig
// (device 0's name, a non-blocking stream, a cuBLAS handle on it with an explicit workspace, CUDA
// events, and the L2 flush: a memset of twice the L2 size before every timed run, so that no run
// starts with weights already in L2).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "twell/error.hpp"

namespace twell::testing {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error("bench", what, "cudaSuccess", cudaGetErrorString(e));
}
inline void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error("bench", what, "CUBLAS_STATUS_SUCCESS", std::to_string(int(s)));
}

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  void alloc(size_t b) {  // exactly b bytes (the memory figures count them), contents undefined
    reset();
    check(cudaMalloc(&p, b ? b : 1), "cudaMalloc");
    bytes = b;
  }
  void resize(size_t b) {  // at least b bytes: grows only
    if (b > bytes) alloc(b);
  }
  void reset() {
    if (p) cudaFree(p);
    p = nullptr;
    bytes = 0;
  }
  uint8_t* at(size_t offset) const { return static_cast<uint8_t*>(p) + offset; }
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
};

class CudaRig {
 public:
  static constexpr size_t kBlasWorkspace = size_t(32) << 20;  // cuBLAS's recommendation on Hopper

  CudaRig() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      (void)cudaGetLastError();
      throw Error("bench", "backend", "a CUDA device", "none");
    }
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    name = prop.name;
    flush_.alloc(size_t(2) * size_t(prop.l2CacheSize));
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
    check(cublasCreate(&blas), "cublasCreate");
    check(cublasSetStream(blas, stream), "cublasSetStream");
    // After cublasSetStream, which resets the workspace to cuBLAS's own pool.
    blas_workspace.alloc(kBlasWorkspace);
    check(cublasSetWorkspace(blas, blas_workspace.p, blas_workspace.bytes), "cublasSetWorkspace");
  }
  ~CudaRig() {
    cublasDestroy(blas);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream);
  }
  CudaRig(const CudaRig&) = delete;
  CudaRig& operator=(const CudaRig&) = delete;

  // Enqueues the L2 flush on `stream`: no later run finds the weights in L2.
  void flush() { check(cudaMemsetAsync(flush_.p, 0, flush_.bytes, stream), "L2 flush"); }
  // Flushes L2, then times job() (which only enqueues on `stream`) with CUDA events: milliseconds.
  template <typename Job>
  double time(Job&& job) {
    flush();
    check(cudaEventRecord(start_, stream), "cudaEventRecord");
    job();
    check(cudaEventRecord(stop_, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, start_, stop_), "cudaEventElapsedTime");
    return t;
  }
  void sync(const char* what) { check(cudaStreamSynchronize(stream), what); }

  std::string name;
  cudaStream_t stream{};
  cublasHandle_t blas{};
  DeviceBuffer blas_workspace;

 private:
  cudaEvent_t start_{}, stop_{};
  DeviceBuffer flush_;
};

}  // namespace twell::testing
