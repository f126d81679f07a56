// Runs one problem on one device, for the benchmark harness (bench/) and `twell check`: the same
// code path on every backend. Implementations: CPU (std::chrono; cpu_runner.cpp) and CUDA (events,
// L2 flushed before each timed run; cuda_runner.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "twell/ffn.hpp"
#include "workload.hpp"

namespace twell::testing {

// What a row times: the plan forced dense (the baseline), the gate GEMM alone, the plan as users
// get it (automatic dispatch).
enum class Job : uint8_t { dense, gate, twell };

// Runs one problem on one device. Implementations: CPU (std::chrono) and CUDA (events, L2 flushed
// before each timed run). The harness interleaves the jobs rep by rep, so clock and temperature
// drift over a row's measurements falls on all of them alike.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual std::string device() const = 0;
  virtual std::string backend() const = 0;
  virtual void load(Problem& p) = 0;
  virtual void warm(Job j) = 0;          // one untimed run, finished before it returns
  virtual double time_once(Job j) = 0;   // one timed run, milliseconds
  virtual RunInfo run_once(Dispatch d, std::vector<uint8_t>& y_host) = 0;
  virtual RunInfo last_run(Dispatch d) = 0;  // of the last run with this dispatch
  // Options of every plan the runner builds (their dispatch is the job's: force_dense for the
  // dense job, `twell` for the twell job); call before load().
  void configure(const InferenceOptions& o, Dispatch twell) {
    options_ = o;
    twell_dispatch_ = twell;
  }
  // CUDA: time_once replays a CUDA graph of each job, captured at its first timed run (after the
  // warm-ups: automatic dispatch's decision is the graph's), as a decoding loop runs; the CPU
  // runner ignores it.
  void replay_graphs(bool on) { graphs_ = on; }

 protected:
  // The plan over layer `layer`'s weights (w_, then more_layers_) with dispatch d, made with
  // options_ at its first use (load() sets the weights and clears plans_).
  InferencePlan& plan_for(Dispatch d, int layer = 0) {
    for (auto& [at, disp, plan] : plans_)
      if (at == layer && disp == d) return plan;
    InferenceOptions o = options_;
    o.dispatch = d;
    plans_.emplace_back(layer, d, InferencePlan(weights_of(layer), o));
    return std::get<2>(plans_.back());
  }
  const FfnWeights& weights_of(int layer) const { return layer == 0 ? w_ : more_layers_[size_t(layer - 1)]; }
  int layers() const { return 1 + int(more_layers_.size()); }

  InferenceOptions options_;
  Dispatch twell_dispatch_ = Dispatch::automatic;
  bool graphs_ = false;
  FfnWeights w_;
  std::vector<FfnWeights> more_layers_;  // CUDA graphs: copies of w_, one per further layer
  std::vector<std::tuple<int, Dispatch, InferencePlan>> plans_;  // (layer, dispatch, plan)
};
std::unique_ptr<Runner> make_cpu_runner();
std::unique_ptr<Runner> make_cuda_runner();  // throws Error without CUDA or without a device

}  // namespace twell::testing
