// The training suite of the harness (`twell bench --suite training`): one FFN forward + backward,
// the dense baseline (bench/training_dense.hpp: cuBLAS / CBLAS GEMMs and elementwise passes, bf16
// storage, fp32 compute, fp32 weight gradients) against twell's TrainingPlan on the same inputs.
// Per case: both steps once on poisoned outputs, compared with each other (grad_rel_diff); then
// warm-up and interleaved timed reps, as the inference suite does. Memory figures are computed from
// the buffers each job allocates (see TrainingMemory).
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.hpp"

namespace twell::bench {

// Bytes a job holds. saved: kept from forward to backward beyond x (which both keep): dense
// [relu(G) | U], twell the saved TwELL layout. peak: every buffer the job's step has allocated at
// its peak (backward): x, dy, y, dx, the three weights, the three f32 weight gradients, the stats,
// plus dense: [relu(G) | U], [dg | du], h and the cuBLAS workspace; twell: the saved layout and
// the workspace of the saved form the step runs (TrainingPlan::workspace_bytes(M, form), forward
// and backward share it).
struct TrainingMemory {
  size_t saved = 0, peak = 0;
};

struct TrainingRow {
  std::string suite, device, backend;
  testing::ProblemSpec spec;
  double l0 = 0;                 // twell's stats[0]: mean active neurons per token
  double l1 = 0;                 // twell's stats[1]: L1 value (sum |h| / M), unscaled
  double density = 0;            // measured: l0 / N
  double l1_coef = 0;
  Timing dense, twell;           // one forward + backward, milliseconds
  double speedup = 0;            // dense.median / twell.median
  TrainingMemory dense_mem, twell_mem;
  double saved_ratio = 0, peak_ratio = 0;  // dense / twell
  int64_t routed_rows = 0;       // twell's saved num_routed
  std::string path = "sparse";   // twell's saved form in the checked and timed steps: sparse
                                 // (compact), dense, or mixed (dispatch changed it during the reps)
  // twell vs dense on the same inputs: ||twell - dense|| / ||dense|| (Frobenius) per output, and
  // their max; -1 when not checked. grad_tolerance: the bound the row is checked against.
  double diff_y = -1, diff_dx = -1, diff_dgate = -1, diff_dup = -1, diff_ddown = -1;
  double grad_rel_diff = -1, grad_tolerance = 0;
  double dense_tflops = 0, twell_tflops = 0;  // 18 M K N (gated step) / time
  std::string source;            // captured layers: "<folder> layer <i>"; empty: generated
  testing::Json model = testing::Json::object();  // captured: the model behind it (Cases::model)
  bool ok() const { return grad_rel_diff <= grad_tolerance; }  // false for NaN
};

enum class TrainJob : uint8_t { dense, twell };

// Thrown by TrainingRunner::load for a case the device cannot hold: reported and skipped, not a
// failure (the default suite's M = 262144 case needs ~36 GB).
struct SkipCase : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One step's outputs, downloaded: y and dx in the problem's dtype, weight gradients f32 [N, K].
struct TrainingOutputs {
  std::vector<uint8_t> y, dx;
  std::vector<float> dgate, dup, ddown;
  float stats[2] = {0, 0};  // twell only: {L0, L1}
  int64_t routed_rows = 0;  // twell only
};

// Runs one training problem on one device (CPU: std::chrono; CUDA: events on the runner's stream,
// L2 flushed before each timed run). Both jobs share x, dy, the weights and the outputs.
class TrainingRunner {
 public:
  virtual ~TrainingRunner() = default;
  virtual std::string device() const = 0;
  virtual std::string backend() const = 0;
  // Allocates this case's buffers (the previous case's are freed first) and uploads x, dy and the
  // weights. Gated problems only.
  virtual void load(const testing::Problem& p, const std::vector<uint8_t>& dy, double l1_coef) = 0;
  virtual void release() = 0;            // frees the case's buffers
  virtual void warm(TrainJob j) = 0;     // one untimed step, finished before it returns
  virtual double time_once(TrainJob j) = 0;  // one timed step, milliseconds
  virtual TrainingOutputs run_once(TrainJob j) = 0;  // outputs poisoned, one step, downloaded
  virtual TrainingMemory memory(TrainJob j) const = 0;
  virtual bool twell_dense() const { return false; }  // twell's saved form: dense (CUDA dispatch)
  // The twell plan's TrainingOptions::dispatch; call before load().
  void configure(Dispatch d) { dispatch_ = d; }

 protected:
  Dispatch dispatch_ = Dispatch::automatic;
};
std::unique_ptr<TrainingRunner> make_cpu_training_runner();
std::unique_ptr<TrainingRunner> make_cuda_training_runner();  // throws Error without CUDA

// What both runners count: the bytes every job holds (x, dy, y, dx, weights, f32 weight
// gradients, stats), and the dense job's own (saved [relu(G) | U], [dg | du], h, BLAS workspace).
size_t training_common_bytes(const testing::ProblemSpec& s);
TrainingMemory dense_training_memory(const testing::ProblemSpec& s, size_t blas_workspace);
TrainingMemory twell_training_memory(const testing::ProblemSpec& s, size_t saved, size_t workspace);

std::vector<testing::ProblemSpec> training_cases(bool cuda);
// The upstream gradient of a case: an independent random [M, K] matrix in the dtype.
std::vector<uint8_t> make_upstream_gradient(const testing::ProblemSpec& s);
// Runs the suite (o.from_dir set: each layer of that capture folder, random dy), printing a
// progress line per case to `progress`. With `errors`, a case that
// throws is reported there ("<case>: <what>") and left out, and the later cases still run (a GPU
// run keeps what it measured); without, the exception propagates.
std::vector<TrainingRow> run_training(const Options& o, std::ostream& progress,
                                      std::vector<std::string>* errors = nullptr);
void write_training_results(const std::vector<TrainingRow>& rows, const std::string& dir,
                            const std::string& name);
void print_training_table(const std::vector<TrainingRow>& rows, std::ostream& out);

}  // namespace twell::bench
