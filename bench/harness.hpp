// The benchmark harness: one code path for every backend. Per case it times the dense baseline
// (three BLAS/cuBLAS GEMMs + the elementwise op, through the plan's force_dense path), the gate
// GEMM alone (the floor of any sparse scheme that keeps the gate dense) and twell (automatic
// dispatch), checks twell's output against the fp64 oracle, and writes one row per case.
// The training suite (forward + backward, time and memory) is in training.hpp.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "twell/ffn.hpp"
#include "workload.hpp"

namespace twell::bench {

struct Timing {
  double median = 0, p20 = 0, p80 = 0;  // milliseconds
};

struct Row {
  std::string suite, device, backend;
  testing::ProblemSpec spec;
  double density = 0;          // measured: active gate units / (M * N)
  Timing dense, gate, twell;
  double speedup = 0;          // dense.median / twell.median
  int64_t routed_rows = 0;
  bool ran_dense = false;      // automatic dispatch chose the dense path (last timed run)
  double error = 0, tolerance = 0;  // twell vs fp64 oracle (sampled rows); -1 when not checked
  double tflops = 0;           // dense-equivalent FLOPs / twell time
  double gbps = 0;             // x + y + all weights bytes / twell time
};

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
  virtual void load(testing::Problem& p) = 0;
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
  InferenceOptions options_;
  Dispatch twell_dispatch_ = Dispatch::automatic;
  bool graphs_ = false;
};
std::unique_ptr<Runner> make_cpu_runner();
std::unique_ptr<Runner> make_cuda_runner();  // throws Error without CUDA or without a device

struct Options {
  std::string suite = "default";  // default | cpu | inference | decode | training | custom
  std::string backend = "auto";   // auto (CUDA when a device is present) | cpu | cuda
  // -1: the suite's default: warm-up 4 (automatic dispatch times each path twice in its first
  // runs) and 10 reps, for inference and training alike.
  int warmup = -1, reps = -1;
  bool check = true;
  std::string out_dir;            // empty: bench/results/<device slug>/ under the source tree
  testing::ProblemSpec custom;    // the case of suite "custom"
  bool training_custom = false;   // suite "training" runs `custom` (gated) instead of its cases
  InferenceOptions plan;          // the inference plans' options (dispatch set per job)
  Dispatch dispatch = Dispatch::automatic;  // the twell job's (inference and training)
};

std::vector<testing::ProblemSpec> suite_cases(const std::string& suite, bool cuda,
                                              const testing::ProblemSpec& custom);
// Whether o runs on CUDA: backend "cuda", or "auto" with a device present.
bool use_cuda(const Options& o);
// Runs the suite, printing a progress line per case to `progress`; returns the rows.
std::vector<Row> run(const Options& o, std::ostream& progress);
// Writes <dir>/<suite>.json and <dir>/<suite>.csv.
void write_results(const std::vector<Row>& rows, const std::string& dir, const std::string& suite);
void print_table(const std::vector<Row>& rows, std::ostream& out);
std::string device_slug(const std::string& device);  // "NVIDIA H100 80GB HBM3" -> "h100"

Timing summarize(std::vector<double> ms);

// Shared by the suites' writers.
void make_dirs(const std::string& path);
std::string csv_field(const std::string& s);   // quoted, inner quotes doubled
std::string json_escape(const std::string& s);

}  // namespace twell::bench
