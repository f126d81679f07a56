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

#include "json.hpp"    // testing/json.hpp: the one JSON writer
#include "runner.hpp"  // testing/runner.hpp: the Runner interface the harness times through
#include "twell/ffn.hpp"
#include "workload.hpp"

namespace twell::bench {

using testing::Job;
using testing::Runner;

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
  std::string source;          // captured problems: "<folder> layer <i>"; empty: generated
  testing::Json model = testing::Json::object();  // captured: the model behind it (Cases::model)
};

struct Options {
  std::string suite = "default";  // default | cpu | inference | decode | training | custom | real
  // Non-empty: the layers of this capture folder (testing/capture.hpp) instead of the suite's cases,
  // their x cut to from_rows rows (0: all).
  std::string from_dir;
  int64_t from_rows = 0;
  std::string backend = "auto";   // auto (CUDA when a device is present) | cpu | cuda
  // -1: the suite's default: warm-up 6 (automatic dispatch times each path three times in its
  // first runs) and 10 reps, for inference and training alike.
  int warmup = -1, reps = -1;
  int warmup_runs() const { return warmup < 0 ? 6 : warmup; }
  int timed_reps() const { return reps < 0 ? 10 : reps; }
  bool check = true;
  std::string out_dir;            // empty: bench/results/<device slug>/ under the source tree
  testing::ProblemSpec custom;    // the case of suite "custom"
  bool one_case = false;  // suite "training" (gated) or "decode" runs `custom` instead of its cases
  InferenceOptions plan;          // the inference plans' options (dispatch set per job)
  Dispatch dispatch = Dispatch::automatic;  // the twell job's (inference and training)
};

// The cases of a run: generated from `specs`, or, with o.from_dir set, each layer of that capture
// folder (its x cut to o.from_rows rows), the folder's headers and manifest read once, when the
// Cases are made (testing::read_capture).
class Cases {
 public:
  // specs: the suite's generated cases, ignored when o.from_dir names a capture.
  Cases(const Options& o, std::vector<testing::ProblemSpec> specs);
  size_t size() const { return count_; }
  bool captured() const { return !o_.from_dir.empty(); }
  testing::Problem load(size_t i) const;
  std::string source(size_t i) const;  // "<folder> layer <i>"; empty for generated cases
  // Captured: what the capture's manifest says of the model (checkpoint, its L1 coefficient and
  // training log, the layer's densest token) as members for a row; an empty object otherwise.
  testing::Json model(size_t i) const;
  std::string name(size_t i) const;    // for progress lines: the source, or the spec

 private:
  const Options& o_;
  std::vector<testing::ProblemSpec> specs_;
  size_t count_ = 0;
  testing::Json manifest_;  // captured: the folder's manifest.json (null without one)
};

std::vector<testing::ProblemSpec> suite_cases(const std::string& suite, bool cuda,
                                              const testing::ProblemSpec& custom);
// Whether o runs on CUDA: backend "cuda", or "auto" with a device present.
bool use_cuda(const Options& o);
// Runs the suite, printing a progress line per case to `progress`; returns the rows.
std::vector<Row> run(const Options& o, std::ostream& progress);
// The results files' name (without extension): the suite's, or for a custom case (suite custom,
// or one case of the training or decode suite) the suite and the case's parameters, so that each
// case keeps its own files ("custom-gated-bfloat16-m256-k2048-n5632-heavy_tailed-d0.005").
std::string result_name(const Options& o);
// Writes <dir>/<name>.json and <dir>/<name>.csv.
void write_results(const std::vector<Row>& rows, const std::string& dir, const std::string& name);
void print_table(const std::vector<Row>& rows, std::ostream& out);
std::string device_slug(const std::string& device);  // "NVIDIA H100 80GB HBM3" -> "h100"

Timing summarize(std::vector<double> ms);

// Shared by the suites' writers. Every JSON file is written through testing::Json (json.hpp).
void make_dirs(const std::string& path);
std::string csv_field(const std::string& s);   // quoted, inner quotes doubled
std::string json_rows(const std::vector<testing::Json>& rows);  // a JSON array, a row per line
testing::Json timing_json(const Timing& t);    // {"median", "p20", "p80"}, milliseconds
// A row's first members: suite, device, backend and the problem (kind, dtype, M, K, N, pattern,
// target_density).
testing::Json problem_json(const std::string& suite, const std::string& device, const std::string& backend,
                           const testing::ProblemSpec& s);
void add_members(testing::Json& row, const testing::Json& more);  // more's members into row

}  // namespace twell::bench
