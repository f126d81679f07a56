#include "cuda/calibration.hpp"

#include "cuda/cuda_check.hpp"

namespace twell::gpu {

namespace {
constexpr const char* kOp = "InferencePlan";
}

DensityCalibration::DensityCalibration() {
  check_cuda(cudaMallocHost(&host_, sizeof(RunCounters)), kOp, "pinned counters");
  const cudaError_t e = cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    cudaFreeHost(host_);
    check_cuda(e, kOp, "calibration event");
  }
}

DensityCalibration::~DensityCalibration() {
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (host_ != nullptr) cudaFreeHost(host_);
}

bool DensityCalibration::prefer_dense(double dense_above, bool capturing) {
  if (pending_ && !capturing) {
    const cudaError_t e = cudaEventQuery(ready_);
    if (e == cudaSuccess) {
      density_ = elements_ > 0 ? double(host_->active) / elements_ : 0.0;
      pending_ = false;
    } else if (e == cudaErrorNotReady) {
      cudaGetLastError();  // "not ready" is no error; keep it out of later launch checks
    } else {
      check_cuda(e, "InferencePlan::run", "calibration event");
    }
  }
  return density_ > dense_above;
}

void DensityCalibration::measure(const RunCounters* device_counters, int64_t rows, int64_t cols,
                                 cudaStream_t s) {
  const char* op = "InferencePlan::run";
  check_cuda(cudaMemcpyAsync(host_, device_counters, sizeof(RunCounters), cudaMemcpyDeviceToHost, s),
             op, "calibration copy");
  check_cuda(cudaEventRecord(ready_, s), op, "calibration event");
  elements_ = double(rows) * double(cols);
  pending_ = true;
}

}  // namespace twell::gpu
