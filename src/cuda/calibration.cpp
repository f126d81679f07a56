#include "cuda/calibration.hpp"

#include <algorithm>
#include <cmath>

#include "cuda/cuda_check.hpp"

namespace twell::gpu {

namespace {
constexpr const char* kOp = "InferencePlan";
constexpr const char* kRunOp = "InferencePlan::run";
constexpr double kDensityBucketsPerOctave = 2.0;  // density regimes ~1.41x apart
}  // namespace

DispatchCalibration::DispatchCalibration() {
  check_cuda(cudaMallocHost(&host_, sizeof(RunCounters)), kOp, "pinned counters");
  cudaError_t e = cudaEventCreate(&begin_);
  if (e == cudaSuccess) e = cudaEventCreate(&end_);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    for (cudaEvent_t ev : {begin_, end_})
      if (ev != nullptr) cudaEventDestroy(ev);
    cudaFreeHost(host_);
    check_cuda(e, kOp, "calibration events");
  }
}

DispatchCalibration::~DispatchCalibration() {
  if (begin_ != nullptr) cudaEventDestroy(begin_);
  if (end_ != nullptr) cudaEventDestroy(end_);
  if (copied_ != nullptr) cudaEventDestroy(copied_);
  if (host_ != nullptr) cudaFreeHost(host_);
}

DispatchCalibration::Regime DispatchCalibration::regime(int64_t rows) const {
  const int r = rows > 0 ? int(std::lround(std::log2(double(rows)))) : 0;
  const int d = density_ > 0 ? int(std::floor(std::log2(density_) * kDensityBucketsPerOctave)) : -1000;
  return {r, d};
}

void DispatchCalibration::poll() {
  if (!pending_) return;
  const cudaError_t e = cudaEventQuery(copied_);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is no error; keep it out of later launch checks
    return;
  }
  check_cuda(e, kRunOp, "calibration event");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, begin_, end_), kRunOp, "calibration timing");
  // The run's time belongs to the regime of the density it ran at.
  density_ = pending_elements_ > 0 ? double(host_->active) / pending_elements_ : 0.0;
  Times& t = times_[regime(pending_rows_)];
  const int path = pending_dense_ ? 1 : 0;
  t.best_ms[path] = t.runs[path] == 0 ? ms : std::min(t.best_ms[path], ms);
  ++t.runs[path];
  pending_ = false;
}

bool DispatchCalibration::prefer_dense(int64_t rows, double dense_above, bool capturing) {
  if (!capturing) poll();
  if (density_ < 0) return false;
  if (density_ > dense_above) return true;
  const auto it = times_.find(regime(rows));
  if (it == times_.end()) return false;
  const Times& t = it->second;
  if (t.runs[0] < kTrials || t.runs[1] < kTrials) return t.runs[1] < t.runs[0];  // alternate
  return t.best_ms[1] < t.best_ms[0];
}

void DispatchCalibration::start(cudaStream_t s) {
  started_ = !pending_;  // one measurement in flight at a time
  if (started_) check_cuda(cudaEventRecord(begin_, s), kRunOp, "calibration event");
}

void DispatchCalibration::finish(const RunCounters* device_counters, int64_t rows, int64_t cols,
                                 bool dense, cudaStream_t s) {
  if (!started_) return;
  started_ = false;
  check_cuda(cudaEventRecord(end_, s), kRunOp, "calibration event");
  check_cuda(cudaMemcpyAsync(host_, device_counters, sizeof(RunCounters), cudaMemcpyDeviceToHost, s),
             kRunOp, "calibration copy");
  check_cuda(cudaEventRecord(copied_, s), kRunOp, "calibration event");
  pending_ = true;
  pending_dense_ = dense;
  pending_rows_ = rows;
  pending_elements_ = double(rows) * double(cols);
}

}  // namespace twell::gpu
