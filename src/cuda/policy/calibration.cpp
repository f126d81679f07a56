#include "cuda/policy/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"
#include "cuda/runtime/no_copy.hpp"

namespace twell::gpu {

namespace {
constexpr const char* kOp = "InferencePlan";
constexpr const char* kRunOp = "InferencePlan::run";
constexpr const char* kTrainOp = "TrainingPlan";
constexpr double kDensityBucketsPerOctave = 2.0;  // density regimes ~1.41x apart

// Lets this thread poll events while some stream captures a CUDA graph. The events polled were
// recorded by earlier, uncaptured runs, which is legal to query; but a capture begun in global
// mode (PyTorch's default) forbids cudaEventQuery on every thread that has not relaxed its own
// mode, and a forbidden call invalidates the capture. TrainingPlan::saved_shape, which polls,
// takes no stream: a framework may well call it inside its capture.
class RelaxedCapture : NoCopy {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;  // then the mode to restore
};

// Whether the event has completed; "not ready" is kept out of later launch checks.
bool passed(cudaEvent_t e, const char* op) {
  const cudaError_t r = cudaEventQuery(e);
  if (r == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  check_cuda(r, op, "calibration event");
  return true;
}
}  // namespace

PathTimes::Regime PathTimes::regime(int64_t rows, double density) {
  const int r = rows > 0 ? int(std::lround(std::log2(double(rows)))) : 0;
  const int d = density > 0 ? int(std::floor(std::log2(density) * kDensityBucketsPerOctave)) : -1000;
  return {r, d};
}

void PathTimes::add(int64_t rows, double density, bool dense, float ms) {
  Times& t = times_[regime(rows, density)];
  const int path = dense ? 1 : 0;
  t.best_ms[path] = t.runs[path] == 0 ? ms : std::min(t.best_ms[path], ms);
  ++t.runs[path];
}

PathTimes::Decision PathTimes::decide(int64_t rows, double density, double dense_above) const {
  Decision d;
  if (density < 0) return d;  // no density yet: sparse, trying
  if (density > dense_above) return {true, false, true};
  const auto it = times_.find(regime(rows, density));
  if (it == times_.end()) return d;
  const Times& t = it->second;
  const bool faster_dense = t.best_ms[1] < t.best_ms[0] * (1.0 + sparse_margin_);
  d.trying = t.runs[0] < kTrials || t.runs[1] < kTrials;
  d.dense = d.trying ? t.runs[1] < t.runs[0] : faster_dense;  // trials alternate from sparse
  d.settled_dense = t.runs[0] > 0 && t.runs[1] > 0 && faster_dense;
  return d;
}

OwnedEvent::OwnedEvent(unsigned flags, const char* op) {
  check_cuda(cudaEventCreateWithFlags(&event_, flags), op, "calibration event");
}

OwnedEvent::~OwnedEvent() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

template <typename T>
PinnedCount<T>::PinnedCount(const char* op) : op_(op), copied_(cudaEventDisableTiming, op) {
  check_cuda(cudaMallocHost(&host_, sizeof *host_), op, "pinned count");
}

template <typename T>
PinnedCount<T>::~PinnedCount() {
  if (host_ != nullptr) cudaFreeHost(host_);
}

template <typename T>
void PinnedCount<T>::record(const T* device_count, cudaStream_t s) {
  check_cuda(cudaMemcpyAsync(host_, device_count, sizeof *host_, cudaMemcpyDeviceToHost, s), op_, "count copy");
  check_cuda(cudaEventRecord(copied_, s), op_, "calibration event");
  pending_ = true;
}

template <typename T>
bool PinnedCount<T>::poll() {
  if (!pending_ || !passed(copied_, op_)) return false;
  pending_ = false;
  return true;
}

template class PinnedCount<unsigned long long>;
template class PinnedCount<int32_t>;

void DensityProbe::record(const unsigned long long* device_active, int64_t rows, int64_t cols,
                          cudaStream_t s) {
  count_.record(device_active, s);
  elements_ = double(rows) * double(cols);
}

bool DensityProbe::poll() {
  if (!count_.poll()) return false;
  density_ = elements_ > 0 ? double(count_.value()) / elements_ : 0.0;
  return true;
}

int32_t long_row_limit(double density, int64_t cols, Determinism determinism) {
  if (determinism == Determinism::deterministic || !(density >= 0.0)) return RowConfig::kLongRow;
  const double limit = std::ceil(RowConfig::kLongRowMeans * density * double(cols));
  return int32_t(std::clamp<double>(limit, RowConfig::kMinLongRow, RowConfig::kLongRow));
}

void RoutedCapacity::record(const int32_t* device_count, int64_t rows, bool capturing, cudaStream_t s) {
  if (!enabled_ || capturing) return;
  count_.record(device_count, s);
  pending_rows_ = rows;
}

int64_t RoutedCapacity::capacity(int64_t rows, int64_t limit, bool capturing) {
  if (!enabled_) return 0;
  if (!capturing && count_.poll()) {
    last_ = count_.value();
    last_rows_ = pending_rows_;
  }
  if (last_ <= 0 || last_rows_ <= 0 || limit <= 0) return 0;
  const double expected = double(last_) * double(rows) / double(last_rows_);
  const int64_t want = int64_t(std::ceil(expected * RoutedBlasConfig::kHeadroom)) + RoutedBlasConfig::kSlack;
  const int64_t step = RoutedBlasConfig::kRowMultiple;
  const int64_t c = std::min({(want + step - 1) / step * step, limit, rows});
  // Keep the last C while it holds the expected rows, is under twice what they need and fits this
  // run's buffers and rows: each new C is a new cuBLASLt plan (host work), and counts vary a
  // little from run to run.
  if (!(capacity_ >= c && capacity_ < 2 * c && capacity_ <= std::min(limit, rows))) capacity_ = c;
  return capacity_;
}

void SavedCapacity::record(const int32_t* device_routed, int64_t rows, int32_t capacity, cudaStream_t s) {
  if (count_.pending()) return;  // one count in flight at a time
  count_.record(device_routed, s);
  pending_rows_ = rows;
  pending_capacity_ = capacity;
}

int32_t SavedCapacity::capacity(double density) {
  if (count_.pending()) {  // else no driver call
    const RelaxedCapture relaxed;  // saved_shape may be asked inside a framework's capture
    if (count_.poll()) choice_.routed(pending_rows_, pending_capacity_, count_.value());
  }
  return choice_.choose(density);
}

DispatchCalibration::DispatchCalibration()
    : begin_(cudaEventDefault, kOp), end_(cudaEventDefault, kOp), probe_(kRunOp) {}

void DispatchCalibration::poll() {
  if (!pending_) return;  // most runs once a regime has chosen: no driver call
  const RelaxedCapture relaxed;
  if (!probe_.poll()) return;
  pending_ = false;
  if (!pending_timed_) return;
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, begin_, end_), kRunOp, "calibration timing");
  // The run's time belongs to the regime of the density it ran at.
  times_.add(pending_rows_, probe_.density(), pending_dense_, ms);
  ran_[pending_dense_ ? 1 : 0] = true;
}

DispatchCalibration::Choice DispatchCalibration::choose(int64_t rows, double dense_above, bool capturing) {
  Choice c;
  if (capturing) {
    c.dense = times_.decide(rows, probe_.density(), dense_above).settled_dense;
    return c;
  }
  poll();
  const PathTimes::Decision d = times_.decide(rows, probe_.density(), dense_above);
  c.dense = d.dense;
  c.timed = d.trying && !pending_;
  c.graph = c.timed && rows <= DispatchConfig::kGraphTimedRows && ran_[c.dense ? 1 : 0];
  return c;
}

void DispatchCalibration::start(const Choice& c, cudaStream_t s) {
  timing_ = c.timed;
  if (timing_) check_cuda(cudaEventRecord(begin_, s), kRunOp, "calibration event");
}

void DispatchCalibration::finish(const unsigned long long* device_active, int64_t rows, int64_t cols,
                                 bool dense, cudaStream_t s) {
  if (pending_) return;  // the last count (and time) still in flight
  if (!timing_ && probe_.density() >= 0 && ++unprobed_ < DispatchConfig::kProbeEvery) return;
  unprobed_ = 0;
  if (timing_) check_cuda(cudaEventRecord(end_, s), kRunOp, "calibration event");
  probe_.record(device_active, rows, cols, s);
  pending_ = true;
  pending_timed_ = timing_;
  pending_dense_ = dense;
  pending_rows_ = rows;
  timing_ = false;
}

GraphTrial::GraphTrial(const char* op)
    : op_(op), fork_(cudaEventDisableTiming, op), join_(cudaEventDisableTiming, op) {
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), op, "graph trial stream");
}

GraphTrial::~GraphTrial() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void GraphTrial::run(cudaStream_t s, const std::function<void(cudaStream_t)>& enqueue,
                     const std::function<void(cudaStream_t)>& before, const std::function<void(cudaStream_t)>& after) {
  check_cuda(cudaEventRecord(fork_, s), op_, "graph trial");
  check_cuda(cudaStreamWaitEvent(stream_, fork_, 0), op_, "graph trial");
  check_cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), op_, "graph trial capture");
  cudaGraph_t graph = nullptr;
  try {
    enqueue(stream_);
  } catch (...) {
    if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  check_cuda(cudaStreamEndCapture(stream_, &graph), op_, "graph trial capture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check_cuda(made, op_, "graph trial instantiation");
  // Destroyed on every exit; in flight, it is freed when the replay completes.
  const std::unique_ptr<CUgraphExec_st, cudaError_t (*)(cudaGraphExec_t)> owned(exec, cudaGraphExecDestroy);
  check_cuda(cudaGraphUpload(exec, stream_), op_, "graph trial upload");  // outside the timed replay
  before(stream_);
  check_cuda(cudaGraphLaunch(exec, stream_), op_, "graph trial replay");
  after(stream_);
  check_cuda(cudaEventRecord(join_, stream_), op_, "graph trial");
  check_cuda(cudaStreamWaitEvent(s, join_, 0), op_, "graph trial");
}

TrainingCalibration::TrainingCalibration()
    : f0_(cudaEventDefault, kTrainOp),
      f1_(cudaEventDefault, kTrainOp),
      b0_(cudaEventDefault, kTrainOp),
      b1_(cudaEventDefault, kTrainOp),
      probe_(kTrainOp) {}

void TrainingCalibration::poll() {
  const RelaxedCapture relaxed;
  if (probe_.poll() && count_is_step_) step_density_ = probe_.density();
  // The step's time belongs to the regime of the density its forward ran at.
  if (stage_ == Stage::timed && step_density_ >= 0 && passed(b1_, kTrainOp) && passed(f1_, kTrainOp)) {
    float forward_ms = 0, backward_ms = 0;
    check_cuda(cudaEventElapsedTime(&forward_ms, f0_, f1_), kTrainOp, "calibration timing");
    check_cuda(cudaEventElapsedTime(&backward_ms, b0_, b1_), kTrainOp, "calibration timing");
    times_.add(step_rows_, step_density_, step_dense_, forward_ms + backward_ms);
    stage_ = Stage::idle;
  }
}

bool TrainingCalibration::prefer_dense(int64_t rows, double dense_above) {
  poll();
  return times_.prefer_dense(rows, probe_.density(), dense_above);
}

void TrainingCalibration::forward_start(const void* saved, cudaStream_t s) {
  poll();
  if (stage_ == Stage::timed) return;  // the measured step's events are still in flight
  stage_ = Stage::forward;             // (a step waiting for its backward is dropped)
  saved_ = saved;
  check_cuda(cudaEventRecord(f0_, s), kTrainOp, "calibration event");
}

void TrainingCalibration::forward_finish(const unsigned long long* device_active, int64_t rows,
                                         int64_t cols, bool dense, cudaStream_t s) {
  // Every forward's count is recorded (the density follows the latest forward); a measured step
  // whose count is overwritten before it arrived is dropped.
  const bool measured = stage_ == Stage::forward;
  if (measured) {
    check_cuda(cudaEventRecord(f1_, s), kTrainOp, "calibration event");
    stage_ = Stage::awaiting_backward;
    step_dense_ = dense;
    step_rows_ = rows;
    step_density_ = -1;
  } else if (probe_.pending() && count_is_step_) {
    stage_ = Stage::idle;
  }
  probe_.record(device_active, rows, cols, s);
  count_is_step_ = measured;
}

void TrainingCalibration::backward_start(const void* saved, cudaStream_t s) {
  if (stage_ != Stage::awaiting_backward || saved != saved_) return;
  stage_ = Stage::backward;
  check_cuda(cudaEventRecord(b0_, s), kTrainOp, "calibration event");
}

void TrainingCalibration::backward_finish(cudaStream_t s) {
  if (stage_ != Stage::backward) return;
  stage_ = Stage::timed;
  check_cuda(cudaEventRecord(b1_, s), kTrainOp, "calibration event");
}

}  // namespace twell::gpu
