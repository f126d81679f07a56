#include "cuda/runtime/run_order.hpp"

#include <string>

#include "cuda/runtime/cuda_check.hpp"
#include "twell/error.hpp"

namespace twell::gpu {

OwnedWorkspace::~OwnedWorkspace() {
  if (data_ != nullptr) cudaFree(data_);  // synchronises: no run still uses it afterwards
}

void* OwnedWorkspace::reserve(size_t bytes, cudaStream_t s, cudaEvent_t after, bool capturing,
                              const char* op) {
  if (bytes <= bytes_) return data_;
  if (capturing)
    throw Error(op, "workspace",
                "grown before CUDA-graph capture (run once uncaptured, or pass a workspace)",
                std::to_string(bytes_) + " bytes while " + std::to_string(bytes) + " are needed");
  if (data_ != nullptr) {
    check_cuda(cudaStreamWaitEvent(s, after, 0), op, "workspace release order");
    check_cuda(cudaFreeAsync(data_, s), op, "workspace release");
    data_ = nullptr;
    bytes_ = 0;
  }
  check_cuda(cudaMallocAsync(&data_, bytes, s), op, "workspace allocation");
  bytes_ = bytes;
  return data_;
}

RunOrder::RunOrder(const char* op) {
  check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), op, "run event");
}

RunOrder::~RunOrder() {
  if (done_ != nullptr) cudaEventDestroy(done_);
}

void RunOrder::begin(cudaStream_t s, bool capturing, const char* op) {
  if (!capturing && last_stream_ != nullptr && last_stream_ != s)
    check_cuda(cudaStreamWaitEvent(s, done_, 0), op, "previous run");
}

void RunOrder::end(cudaStream_t s, bool capturing, const char* op) {
  if (capturing) return;
  check_cuda(cudaEventRecord(done_, s), op, "run event");
  last_stream_ = s;
}

void* RunOrder::own_workspace(size_t bytes, cudaStream_t s, bool capturing, const char* op) {
  return own_.reserve(bytes, s, done_, capturing, op);
}

}  // namespace twell::gpu
