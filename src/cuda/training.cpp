// The CUDA training backend. Every step only enqueues work on the caller's stream: no host
// synchronisation, no allocation but the plan's workspace growing outside a capture, so a
// forward + backward can be captured in a CUDA graph. The routed row count exists only on the
// device; kernels over routed rows read it and exit past it.
//   forward:  G = x W1^T (cuBLASLt) -> TwELL pack of relu(G) into `saved` (plane 0 = g) -> compact rows:
//             u into plane 1, y, per-row L1 -> routed rows: inference's dense backup (y, h in G)
//             -> statistics {L0, L1}
//   backward: (routed rows: the saved list, ascending) compact rows: dh per entry, dx -> column
//             index -> per-neuron weight gradients (written) -> routed rows recomputed densely from
//             x and dy on tensor cores: g, u, dh -> dg, du, h -> dx rows, weight gradients (added)
//             -> the NaNs of compact rows whose dy is not finite (launch_nonfinite_dy)
// The dense saved form (backup_capacity == M; automatic dispatch asks for it above dense_above):
//   forward:  G = x W1^T and U = x Wu^T (cuBLASLt) straight into the backup planes ->
//             h = relu(G) U (plain: relu(G), over G) and the activation count -> y = h Wd -> layout
//             (every row routed) -> stats
//   backward: dh = dy Wd^T -> [dg | du], h (elementwise) -> dx = [dg | du] [Wg; Wu] (cuBLASLt,
//             depth 2N) -> dWg, dWu, dWd (cuBLAS, fp32 out)
// Nothing depends on the order of an atomic or a float reduction across CTAs. Determinism::fast
// (the default) runs the first C routed rows' dense products through cuBLAS, C learned from earlier
// steps' counts, and routes compact rows of many entries too (route_above): a routed row's
// rounding can change once C does. Determinism::deterministic keeps both off: bit-identical reruns.
// W1 is the gate weight (gated) or the up weight (plain). docs/kernels.md has the reasoning.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <string>

#include "core/backend.hpp"
#include "cuda/blas_gemm.hpp"
#include "cuda/calibration.hpp"
#include "cuda/config.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device.hpp"
#include "cuda/kernels.hpp"
#include "cuda/lt_gemm.hpp"
#include "cuda/train_config.hpp"
#include "cuda/train_kernels.hpp"
#include "cuda/train_workspace.hpp"
#include "cuda/workspace.hpp"

namespace twell::gpu {

namespace {

constexpr const char* kPlanOp = "TrainingPlan";
constexpr const char* kForwardOp = "TrainingPlan::forward";
constexpr const char* kBackwardOp = "TrainingPlan::backward";

// Throws Error naming `name` unless p is device (or managed) memory usable on `device`; for
// buffers read or written element by element (no vector alignment needed).
void check_device_memory(const void* p, int device, const char* op, const char* name) {
  cudaPointerAttributes a{};
  check_cuda(cudaPointerGetAttributes(&a, p), op, name);
  const std::string want = "device memory on cuda:" + std::to_string(device);
  if (a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost)
    throw Error(op, name, want, "host memory");
  if (a.type == cudaMemoryTypeDevice && a.device != device)
    throw Error(op, name, want, "memory on cuda:" + std::to_string(a.device));
}

void check_saved_memory(const TwellView& v, int device, const char* op) {
  check_device_memory(v.num_routed, device, op, "saved num_routed");
  if (v.shape.rows == 0) return;
  check_device_memory(v.values, device, op, "saved values");
  check_device_memory(v.cols, device, op, "saved cols");
  check_device_memory(v.counts, device, op, "saved counts");
  check_device_memory(v.row_slot, device, op, "saved row_slot");
  check_device_memory(v.routed_rows, device, op, "saved routed_rows");
  if (v.shape.backup_capacity > 0) check_device_memory(v.backup, device, op, "saved backup");
}

void check_rows(int64_t rows, const char* op) {
  if (rows > ShapeLimits::kMaxRows)
    throw Error(op, "x", "at most " + std::to_string(ShapeLimits::kMaxRows) + " rows (int32 row indices)",
                std::to_string(rows));
}

template <typename P>
P* at(char* base, size_t offset) {
  return reinterpret_cast<P*>(base + offset);
}

class CudaTraining final : public detail::TrainingBackend {
 public:
  CudaTraining(const FfnWeights& w, const TrainingOptions& o)
      : weights_(w),
        options_(o),
        dims_(supported_dims(w, o.tile, o.capacity, kPlanOp)),
        device_(query_device(w.up.device.index, kPlanOp)),
        fused_gate_(o.gate == GateKernel::automatic && gate_pack_available(device_)) {
    DeviceGuard guard(device_.index, kPlanOp);
    if (w.kind == FfnKind::gated) check_device_pointer(w.gate.data, device_.index, kPlanOp, "gate weight");
    check_device_pointer(w.up.data, device_.index, kPlanOp, "up weight");
    check_device_pointer(w.down.data, device_.index, kPlanOp, "down weight");
    lt_ = std::make_unique<LtGemm>(dims_.dtype);
    blas_ = std::make_unique<BlasGemm>(dims_.dtype);
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), kPlanOp, "run event");
    check_cuda(cudaMalloc(&fault_flag_, sizeof(SavedFault)), kPlanOp, "saved-state fault flag");
    check_cuda(cudaHostAlloc(&fault_report_, sizeof(SavedFault), cudaHostAllocMapped), kPlanOp,
               "saved-state fault report");
    *fault_report_ = SavedFault{};
  }

  ~CudaTraining() override {
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (fault_flag_ != nullptr) cudaFree(fault_flag_);
    if (fault_report_ != nullptr) cudaFreeHost(fault_report_);
  }

  DType saved_dtype() const override { return dims_.dtype; }
  void set_weights(const FfnWeights& w) override { weights_ = w; }
  size_t workspace_bytes(int64_t rows, SavedForm form) const override {
    // The dense form's forward carves the forward layout too (its G and h).
    const size_t forward = train_forward_layout(dims_, rows).bytes;
    if (form == SavedForm::dense) return std::max(forward, dense_backward_layout(rows).bytes);
    return std::max(forward, train_backward_layout(dims_, rows).bytes);
  }
  bool supports_dense_layout() const override { return options_.dispatch != Dispatch::force_sparse; }
  bool wants_dense_layout(int64_t rows) override {
    if (rows == 0 || options_.dispatch == Dispatch::force_sparse) return false;
    if (options_.dispatch == Dispatch::force_dense) return true;
    return calibration_.prefer_dense(rows, options_.dense_above);
  }

  void forward(const TrainingForwardArgs& args, const TwellView& saved, Stream stream) override;
  void forward_sparse(const TrainingForwardArgs& args, const TwellView& saved, int64_t rows, char* base,
                      bool capturing, cudaStream_t s);
  void backward(const TrainingBackwardArgs& args, const TensorView& x, const TwellView& saved,
                Stream stream) override;

  void seal_saved(const TwellView& saved, const TwellHeader& header, Stream stream) override {
    DeviceGuard guard(device_.index, kForwardOp);
    launch_write_header(saved.header, header, resolve_stream(stream), kForwardOp);
  }
  void check_saved(const TwellView& saved, const TwellHeader& expected, Stream stream) override {
    if (saved.shape.rows == 0) return;  // backward reads nothing of an empty state
    DeviceGuard guard(device_.index, kBackwardOp);
    launch_saved_check({saved, expected, fault_flag_, fault_report_}, device_, resolve_stream(stream));
  }
  // The report is host-mapped: reading it needs no synchronisation; a fault shows here once the
  // check that found it has run.
  void raise_reported_fault(const char* op) override {
    const volatile SavedFault* r = fault_report_;
    const int32_t code = r->code;
    if (code == 0) return;
    const int64_t row = r->row, value = r->value;
    *fault_report_ = SavedFault{};
    static constexpr const char* kWhat[] = {"", "header word", "num_routed", "routed_rows entry", "row_slot",
                                            "count", "column"};
    const bool known = code > 0 && code < int32_t(std::size(kWhat));
    throw Error(op, "saved", "the state a forward of this plan wrote (checked on the device before backward)",
                std::string("a corrupted or foreign buffer: ") + (known ? kWhat[code] : "fault") + " " +
                    std::to_string(value) + (row >= 0 ? " at row " + std::to_string(row) : std::string()));
  }

  std::shared_ptr<void> allocate(size_t bytes) override {
    DeviceGuard guard(device_.index, kForwardOp);
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), kForwardOp, "saved activations");
    return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  }

  int64_t routed_rows(const TwellView& saved) override {
    const char* op = "SavedActivations::routed_rows";
    DeviceGuard guard(device_.index, op);
    check_cuda(cudaDeviceSynchronize(), op, "device synchronisation");
    raise_reported_fault(op);
    int32_t routed = 0;
    check_cuda(cudaMemcpy(&routed, saved.num_routed, sizeof routed, cudaMemcpyDeviceToHost), op,
               "routed row count");
    return routed;
  }

 private:
  // The workspace base for a run of `rows` rows on s: the caller's, or the plan's own, ordered
  // after the previous run.
  char* begin(int64_t rows, const TensorView& caller, cudaStream_t s, bool capturing,
              const char* op) {
    // Runs on different streams share the plan's workspace: order them.
    if (!capturing && last_stream_ != nullptr && last_stream_ != s)
      check_cuda(cudaStreamWaitEvent(s, done_, 0), op, "previous run");
    if (caller.defined()) return aligned_base(caller.data);
    // Sized for every form dispatch may pick (it persists from run to run, and a capture cannot grow it).
    return aligned_base(own_.reserve(any_form_workspace_bytes(rows), s, done_, capturing, op));
  }

  void end(cudaStream_t s, bool capturing, const char* op) {
    if (capturing) return;
    check_cuda(cudaEventRecord(done_, s), op, "run event");
    last_stream_ = s;
  }

  // Whether the dense backward copies [Wg; Wu] into the workspace (gated weights where Wu does not
  // follow Wg in memory; a fused gate-up parameter is read in place).
  bool copies_weights() const {
    return dims_.kind == FfnKind::gated &&
           static_cast<const char*>(weights_.up.data) !=
               static_cast<const char*>(weights_.gate.data) + size_t(dims_.n * dims_.k) * dtype_size(dims_.dtype);
  }
  TrainDenseBackwardLayout dense_backward_layout(int64_t rows) const {
    return train_dense_backward_layout(dims_, rows, copies_weights());
  }

  const void* first_weight() const {
    return dims_.kind == FfnKind::gated ? weights_.gate.data : weights_.up.data;
  }

  // Dense gradients of the routed rows (order[0 .. *count)), added to the compact rows' ones.
  struct RoutedBuffers {
    const int32_t* order = nullptr;
    const int32_t* count = nullptr;
    char* p = nullptr;
    char* q = nullptr;
    SplitK split_k;
    int64_t chunk_rows = 0;   // rows of p and q: the routed rows go in chunks of this many
    int64_t blas_rows = 0;    // C: rows order[0 .. C) through cuBLAS (at most chunk_rows)
    char* blas = nullptr;     // their x, dy (dtype) and dx (f32) rows, [C, K] each
    void* lt = nullptr;       // cuBLAS(Lt) scratch, LtConfig::kWorkspaceBytes
  };
  // Determinism::fast: compact rows of more entries than this are routed (TrainRowConfig); -1: none.
  int32_t route_above() const {
    if (options_.determinism != Determinism::fast) return -1;
    return int32_t(std::clamp<int64_t>(dims_.n / TrainRowConfig::kRouteRowDivisor, TrainRowConfig::kRouteRowMin,
                                       TrainRowConfig::kRouteRowMax));
  }
  struct Grads {
    void* dx = nullptr;
    float* dfirst = nullptr;
    float* dup = nullptr;
    float* ddown = nullptr;
  };
  void backward_routed(const void* x, const void* dy, const Grads& g, const RoutedBuffers& b,
                       int64_t rows, const L1Coef& l1, cudaStream_t s);
  // The dense form (saved.shape.backup_capacity == rows): cuBLAS(Lt) GEMMs and elementwise passes.
  void forward_dense(const TrainingForwardArgs& args, const TwellView& saved, int64_t rows, char* base,
                     cudaStream_t s);
  void backward_dense(const TrainingBackwardArgs& args, const TensorView& x, const TwellView& saved,
                      const Grads& g, int64_t rows, char* base, const L1Coef& l1, cudaStream_t s);
  // The statistics {L0, L1} from the active count and the h rows in `hidden` of the routed rows;
  // partials > 0 (the dense form): from the `partials` sums of |h| already in row_l1.
  void launch_statistics(const TwellView& saved, const void* hidden, const unsigned long long* active,
                         float* row_l1, float* stats, int64_t rows, cudaStream_t s, int64_t partials = 0);

  FfnWeights weights_;
  TrainingOptions options_;
  ProblemDims dims_;
  DeviceInfo device_;
  bool fused_gate_;  // the compact forward packs TwELL in the gate GEMM epilogue (gate_pack.cu)
  std::unique_ptr<LtGemm> lt_;
  std::unique_ptr<BlasGemm> blas_;  // the dense path's weight gradients, the routed rows' share
  // Determinism::fast: the routed rows' first C through cuBLAS, C learned from earlier forwards.
  RoutedCapacity routed_capacity_{kForwardOp, options_.determinism};
  TrainingCalibration calibration_;  // automatic dispatch: timed steps of either saved form
  OwnedWorkspace own_;
  cudaEvent_t done_ = nullptr;          // recorded at the end of every uncaptured run
  SavedFault* fault_flag_ = nullptr;    // device: the running saved-state check's first fault
  SavedFault* fault_report_ = nullptr;  // host-mapped: the first fault not yet raised
  cudaStream_t last_stream_ = nullptr;  // the stream of the last uncaptured run
};

void CudaTraining::forward(const TrainingForwardArgs& args, const TwellView& saved, Stream stream) {
  DeviceGuard guard(device_.index, kForwardOp);
  const cudaStream_t s = resolve_stream(stream);
  const bool capturing = is_capturing(s, kForwardOp);
  const int64_t rows = args.x.shape[0];
  check_rows(rows, kForwardOp);
  auto* stats = static_cast<float*>(args.stats.data);
  if (!capturing) {
    if (stats != nullptr) check_device_memory(stats, device_.index, kForwardOp, "stats");
    check_saved_memory(saved, device_.index, kForwardOp);
    if (rows > 0) {
      check_device_pointer(args.x.data, device_.index, kForwardOp, "x");
      check_device_pointer(args.y.data, device_.index, kForwardOp, "y");
    }
  }
  check_cuda(cudaMemsetAsync(saved.num_routed, 0, sizeof(int32_t), s), kForwardOp, "saved num_routed");
  if (rows == 0) {
    if (stats != nullptr) check_cuda(cudaMemsetAsync(stats, 0, 2 * sizeof(float), s), kForwardOp, "stats");
    return;
  }

  char* base = begin(rows, args.workspace, s, capturing, kForwardOp);
  const bool calibrate = !capturing && options_.dispatch == Dispatch::automatic;
  if (calibrate) calibration_.forward_start(saved.values, s);
  const TrainForwardLayout l = train_forward_layout(dims_, rows);
  auto* active = at<unsigned long long>(base, l.active);
  check_cuda(cudaMemsetAsync(active, 0, train_forward_zeroed_bytes(), s), kForwardOp,
             "activation count and split-K counters");
  if (saved.shape.backup_capacity == rows)
    forward_dense(args, saved, rows, base, s);
  else
    forward_sparse(args, saved, rows, base, capturing, s);
  if (calibrate)
    calibration_.forward_finish(active, rows, dims_.n, saved.shape.backup_capacity == rows, s);
  end(s, capturing, kForwardOp);
}

void CudaTraining::forward_sparse(const TrainingForwardArgs& args, const TwellView& saved, int64_t rows,
                                  char* base, bool capturing, cudaStream_t s) {
  const TrainForwardLayout l = train_forward_layout(dims_, rows);
  auto* active = at<unsigned long long>(base, l.active);
  void* hidden = base + l.hidden;
  auto* stats = static_cast<float*>(args.stats.data);
  float* row_l1 = stats != nullptr ? at<float>(base, l.row_l1) : nullptr;

  if (fused_gate_) {  // the gate GEMM packs plane 0 itself; G holds only the routed rows
    GatePackArgs fused;
    fused.op = kForwardOp;
    fused.kind = dims_.kind;
    fused.x = args.x.data;
    fused.weight = first_weight();
    fused.k = dims_.k;
    fused.out = saved;
    fused.hidden = hidden;
    fused.active = active;
    fused.route_above = route_above();
    launch_gate_pack(fused, device_, s);
  } else {
    lt_->run(linear_call(GemmId::gate, rows, dims_.n, dims_.k, args.x.data, first_weight(),
                         hidden),
             s, base + l.lt);

    PackArgs pack;
    pack.kind = dims_.kind;
    pack.hidden = hidden;
    pack.out = saved;
    pack.active = active;
    launch_pack(pack, device_, s);
    if (const int32_t above = route_above(); above >= 0)
      launch_route_overflow(saved, hidden, device_, s, kForwardOp, above);
  }

  ForwardRowsArgs compact;
  compact.kind = dims_.kind;
  compact.x = args.x.data;
  compact.up = weights_.up.data;
  compact.down = weights_.down.data;
  compact.y = args.y.data;
  compact.row_l1 = row_l1;
  compact.k = dims_.k;
  compact.saved = saved;
  compact.control = at<int32_t>(base, l.control);
  compact.long_rows = at<int32_t>(base, l.long_rows);
  launch_forward_rows(compact, device_, s);

  RoutedArgs routed = routed_args(dims_, weights_, args.x.data, args.y.data, hidden, rows,
                                  saved.routed_rows, saved.num_routed);
  routed.split_k = {at<float>(base, l.split_partials), at<int32_t>(base, l.split_counters)};
  routed.first = routed_capacity_.capacity(rows, l.blas_rows, capturing);
  launch_routed_blas(*lt_, routed, routed.first, base + l.routed_blas, base + l.lt, device_, s, kForwardOp);
  launch_routed(routed, device_, s);
  launch_routed_renumber(saved, s);
  routed_capacity_.record(saved.num_routed, rows, capturing, s);

  launch_statistics(saved, hidden, active, row_l1, stats, rows, s);
}

void CudaTraining::launch_statistics(const TwellView& saved, const void* hidden,
                                     const unsigned long long* active, float* row_l1, float* stats,
                                     int64_t rows, cudaStream_t s, int64_t partials) {
  if (stats == nullptr) return;
  StatsArgs st;
  st.dtype = dims_.dtype;
  st.hidden = hidden;
  st.n = dims_.n;
  st.rows = rows;
  st.routed_rows = saved.routed_rows;
  st.num_routed = saved.num_routed;
  st.active = active;
  st.row_l1 = row_l1;
  st.stats = stats;
  st.partials = partials;
  launch_stats(st, device_, s);
}

void CudaTraining::backward(const TrainingBackwardArgs& args, const TensorView& x,
                            const TwellView& saved, Stream stream) {
  DeviceGuard guard(device_.index, kBackwardOp);
  const cudaStream_t s = resolve_stream(stream);
  const bool capturing = is_capturing(s, kBackwardOp);
  const int64_t rows = x.shape[0];
  check_rows(rows, kBackwardOp);
  const bool gated = dims_.kind == FfnKind::gated;
  Grads g;
  g.dx = args.dx.data;
  g.dfirst = static_cast<float*>(gated ? args.dgate.data : args.dup.data);
  g.dup = gated ? static_cast<float*>(args.dup.data) : nullptr;
  g.ddown = static_cast<float*>(args.ddown.data);
  const auto* l1_device = static_cast<const float*>(args.l1_coef.data);
  if (!capturing) {
    if (gated) check_device_pointer(args.dgate.data, device_.index, kBackwardOp, "dgate");
    check_device_pointer(args.dup.data, device_.index, kBackwardOp, "dup");
    check_device_pointer(args.ddown.data, device_.index, kBackwardOp, "ddown");
    if (l1_device != nullptr) check_device_memory(l1_device, device_.index, kBackwardOp, "l1_coef");
    check_saved_memory(saved, device_.index, kBackwardOp);
    if (rows > 0) {
      check_device_pointer(x.data, device_.index, kBackwardOp, "x");
      check_device_pointer(args.dy.data, device_.index, kBackwardOp, "dy");
      check_device_pointer(args.dx.data, device_.index, kBackwardOp, "dx");
    }
  }
  if (rows == 0) {
    const size_t bytes = size_t(dims_.n * dims_.k) * sizeof(float);
    for (float* d : {g.dfirst, g.dup, g.ddown})
      if (d != nullptr) check_cuda(cudaMemsetAsync(d, 0, bytes, s), kBackwardOp, "weight gradients");
    return;
  }

  char* base = begin(rows, args.workspace, s, capturing, kBackwardOp);
  const bool calibrate = !capturing && options_.dispatch == Dispatch::automatic;
  if (calibrate) calibration_.backward_start(saved.values, s);
  auto finish = [&] {
    if (calibrate) calibration_.backward_finish(s);
    end(s, capturing, kBackwardOp);
  };
  const L1Coef l1{l1_device, float(options_.l1_coef)};
  if (saved.shape.backup_capacity == rows) {
    backward_dense(args, x, saved, g, rows, base, l1, s);
    finish();
    return;
  }
  const TrainBackwardLayout l = train_backward_layout(dims_, rows);
  RoutedBuffers rb;
  rb.order = saved.routed_rows;  // ascending: forward renumbered them (launch_routed_renumber)
  rb.count = saved.num_routed;
  rb.p = base + l.p;
  rb.q = base + l.q;
  rb.split_k = {at<float>(base, l.split_partials), at<int32_t>(base, l.split_counters)};
  rb.chunk_rows = l.chunk_rows;
  rb.blas_rows = std::min(routed_capacity_.capacity(rows, l.blas_rows, capturing), l.chunk_rows);
  rb.blas = base + l.routed_blas;
  rb.lt = base + l.lt;
  check_cuda(cudaMemsetAsync(rb.split_k.counters, 0, RoutedGemmConfig::kMaxSplitTiles * sizeof(int32_t), s),
             kBackwardOp, "split-K counters");
  auto* dh = at<float>(base, l.dh);

  // The column index first (it reads the layout alone): the row kernels store each entry's record
  // where it gives them.
  ColumnIndexArgs index;
  index.saved = saved;
  index.block_counts = at<int32_t>(base, l.block_counts);
  index.col_totals = at<int32_t>(base, l.col_totals);
  index.col_ptr = at<int64_t>(base, l.col_ptr);
  index.heavy = at<int32_t>(base, l.heavy);
  index.position = at<int64_t>(base, l.position);
  launch_column_index(index, s);

  BackwardRowsArgs compact;
  compact.kind = dims_.kind;
  compact.dy = args.dy.data;
  compact.first = first_weight();
  compact.up = weights_.up.data;
  compact.down = weights_.down.data;
  compact.dx = args.dx.data;
  compact.dh = dh;
  compact.position = index.position;
  compact.records = at<EntryRecord>(base, l.records);
  compact.l1 = l1;
  compact.k = dims_.k;
  compact.saved = saved;
  compact.control = at<int32_t>(base, l.control);
  compact.long_rows = at<int32_t>(base, l.long_rows);
  launch_backward_rows(compact, device_, s);

  WeightGradArgs wg;
  wg.kind = dims_.kind;
  wg.dtype = dims_.dtype;
  wg.x = x.data;
  wg.dy = args.dy.data;
  wg.n = dims_.n;
  wg.col_ptr = index.col_ptr;
  wg.heavy = index.heavy;
  wg.records = compact.records;
  wg.block_offsets = index.block_counts;
  wg.rows = rows;
  wg.queue = at<int32_t>(base, l.queue);
  wg.dfirst = g.dfirst;
  wg.dup = g.dup;
  wg.ddown = g.ddown;
  wg.k = dims_.k;
  launch_weight_grads(wg, device_, s);

  backward_routed(x.data, args.dy.data, g, rb, rows, l1, s);
  launch_nonfinite_dy({dims_.kind, args.dy.data, saved, args.dx.data, g.dup, g.ddown, dims_.k,
                       compact.control + kNonFiniteDyWord},
                      device_, s);
  finish();
}

void CudaTraining::backward_routed(const void* x, const void* dy, const Grads& g,
                                   const RoutedBuffers& b, int64_t rows, const L1Coef& l1,
                                   cudaStream_t s) {
  const bool gated = dims_.kind == FfnKind::gated;
  const int64_t n = dims_.n, k = dims_.k;
  const int64_t q_cols = gated ? 2 * n : n;
  const size_t es = dtype_size(dims_.dtype);
  const size_t ws = LtConfig::kWorkspaceBytes;  // b.lt's bytes
  char* q_second = b.q + size_t(n) * es;  // gated: columns N .. 2N-1 of q
  // Rows order[0 .. C) through cuBLAS, from gathered x and dy rows (zero past R), into rows 0 .. C
  // of p and q; the rest on the tensor-core kernels, chunk by chunk (p and q hold chunk_rows rows:
  // chunk j takes the rows [j chunk_rows, (j + 1) chunk_rows), the first of them from row C).
  const int64_t c = b.blas_rows;
  const RowList list{b.order, b.count, c};
  char* x_rows = b.blas;
  char* dy_rows = x_rows + size_t(c * k) * es;
  auto* dx_rows = reinterpret_cast<float*>(dy_rows + size_t(c * k) * es);

  // g = relu(x W1^T) -> p;  gated: u = x Wu^T -> q[:, :N];  dh = dy Wd^T -> q[:, N:] (plain: q)
  if (c > 0) {
    launch_gather_rows(x, k, list, x_rows, device_, s, kBackwardOp);
    launch_gather_rows(dy, k, list, dy_rows, device_, s, kBackwardOp);
    lt_->run(linear_call(GemmId::gate, c, n, k, x_rows, first_weight(), b.p), s, b.lt);
    GemmCall call = linear_call(GemmId::up, c, n, k, x_rows, weights_.up.data, b.q);
    call.ldd = q_cols;
    if (gated) lt_->run(call, s, b.lt);
    call = linear_call(GemmId::grad_hidden, c, n, k, dy_rows, weights_.down.data,
                       gated ? q_second : b.q);
    call.ldd = q_cols;
    lt_->run(call, s, b.lt);
  }
  for (int64_t start = 0; start < rows; start += b.chunk_rows) {
    const RoutedChunk chunk{start, start + b.chunk_rows};
    const int64_t first = start == 0 ? c : start;  // the kernels' first row of this chunk
    RecomputeArgs r;
    r.dtype = dims_.dtype;
    r.n_out = n;
    r.k = k;
    r.max_rows = rows;
    r.order = b.order;
    r.count = b.count;
    r.first = first;
    r.chunk = chunk;
    r.split_k = b.split_k;
    r.src = x;
    r.weight = first_weight();
    r.out = b.p;
    r.ldo = n;
    launch_routed_recompute(r, device_, s);
    r.ldo = q_cols;
    if (gated) {
      r.weight = weights_.up.data;
      r.out = b.q;
      launch_routed_recompute(r, device_, s);
    }
    r.src = dy;
    r.weight = weights_.down.data;
    r.out = gated ? q_second : b.q;
    launch_routed_recompute(r, device_, s);

    RoutedHiddenArgs h;
    h.kind = dims_.kind;
    h.dtype = dims_.dtype;
    h.p = b.p;
    h.q = b.q;
    h.n = n;
    h.rows = rows;
    h.l1 = l1;
    h.count = b.count;
    h.chunk = chunk;
    launch_routed_hidden(h, device_, s);

    // dx rows = [dg | du] [W1; Wu]  (plain: dg W1)
    if (start == 0 && c > 0) {
      blas_->matmul(b.q, q_cols, first_weight(), c, n, k, dx_rows, 0.0f, s, b.lt, ws);
      if (gated) blas_->matmul(q_second, q_cols, weights_.up.data, c, n, k, dx_rows, 1.0f, s, b.lt, ws);
      launch_scatter_rows(dims_.dtype, dx_rows, true, k, list, g.dx, device_, s, kBackwardOp);
    }
    InputGradArgs in;
    in.dtype = dims_.dtype;
    in.grad = b.q;
    in.first = first_weight();
    in.second = gated ? weights_.up.data : nullptr;
    in.depth = q_cols;
    in.split = n;
    in.dx = g.dx;
    in.k = k;
    in.max_rows = rows;
    in.order = b.order;
    in.count = b.count;
    in.first_row = first;
    in.chunk = chunk;
    in.split_k = b.split_k;
    launch_routed_input_grad(in, device_, s);

    // dW1 += dg^T x;  gated: dWu += du^T x;  dWd += h^T dy (cuBLAS's rows first, then the kernel's,
    // chunk by chunk: a fixed order)
    if (start == 0 && c > 0) {
      blas_->weight_grad(b.q, q_cols, x_rows, c, n, k, g.dfirst, 1.0f, s, b.lt, ws);
      if (gated) blas_->weight_grad(q_second, q_cols, x_rows, c, n, k, g.dup, 1.0f, s, b.lt, ws);
      blas_->weight_grad(b.p, n, dy_rows, c, n, k, g.ddown, 1.0f, s, b.lt, ws);
    }
    WeightGradGemmArgs w;
    w.dtype = dims_.dtype;
    w.n = n;
    w.k = k;
    w.order = b.order;
    w.count = b.count;
    w.first = first;
    w.chunk = chunk;
    w.grad = b.q;
    w.lda = q_cols;
    w.src = x;
    w.dw = g.dfirst;
    launch_routed_weight_grad(w, device_, s);
    if (gated) {
      w.grad = q_second;
      w.dw = g.dup;
      launch_routed_weight_grad(w, device_, s);
    }
    w.grad = b.p;
    w.lda = n;
    w.src = dy;
    w.dw = g.ddown;
    launch_routed_weight_grad(w, device_, s);
  }
}


void CudaTraining::forward_dense(const TrainingForwardArgs& args, const TwellView& saved, int64_t rows,
                                 char* base, cudaStream_t s) {
  const TrainForwardLayout l = train_forward_layout(dims_, rows);
  auto* active = at<unsigned long long>(base, l.active);
  auto* stats = static_cast<float*>(args.stats.data);
  const bool gated = dims_.kind == FfnKind::gated;
  const size_t plane = size_t(rows) * size_t(dims_.n) * dtype_size(dims_.dtype);
  char* g_plane = static_cast<char*>(saved.backup);  // relu(x W1^T): gated g, plain h
  char* u_plane = g_plane + plane;                    // gated: x Wu^T
  void* h = gated ? base + l.hidden : g_plane;

  lt_->run(linear_call(GemmId::gate, rows, dims_.n, dims_.k, args.x.data, first_weight(),
                       g_plane),
           s, base + l.lt);
  if (gated)
    lt_->run(linear_call(GemmId::up, rows, dims_.n, dims_.k, args.x.data, weights_.up.data,
                         u_plane),
             s, base + l.lt);
  DenseHiddenArgs dh;
  dh.kind = dims_.kind;
  dh.dtype = dims_.dtype;
  dh.hidden = g_plane;
  dh.up = u_plane;
  dh.out = h;
  dh.elements = rows * dims_.n;
  dh.active = active;
  // The statistics' sum |h| comes from this pass (per-CTA sums in row_l1's space), not a re-read of h.
  dh.l1_partials = stats != nullptr ? at<float>(base, l.row_l1) : nullptr;
  const int64_t partials = launch_dense_hidden(dh, device_, s);

  lt_->run(matmul_call(GemmId::down, rows, dims_.k, dims_.n, h, weights_.down.data, args.y.data), s,
           base + l.lt);

  launch_dense_layout(saved, device_, s);
  launch_statistics(saved, h, active, dh.l1_partials, stats, rows, s, partials);
}

void CudaTraining::backward_dense(const TrainingBackwardArgs& args, const TensorView& x, const TwellView& saved,
                                  const Grads& g, int64_t rows, char* base, const L1Coef& l1, cudaStream_t s) {
  const TrainDenseBackwardLayout l = dense_backward_layout(rows);
  const bool gated = dims_.kind == FfnKind::gated;
  const int64_t n = dims_.n, k = dims_.k;
  const size_t es = dtype_size(dims_.dtype);
  const size_t plane = size_t(rows) * size_t(n) * es;
  const char* g_plane = static_cast<const char*>(saved.backup);
  const char* u_plane = g_plane + plane;
  char* q = base + l.q;
  const void* h = gated ? static_cast<const void*>(base + l.dh) : g_plane;  // h overwrites dh

  // dh = dy Wd^T
  lt_->run(linear_call(GemmId::grad_hidden, rows, n, k, args.dy.data, weights_.down.data,
                       base + l.dh),
           s, base + l.lt);

  DenseBackwardArgs e;
  e.kind = dims_.kind;
  e.dtype = dims_.dtype;
  e.g = g_plane;
  e.u = gated ? u_plane : nullptr;
  e.dh = base + l.dh;
  e.q = q;
  e.h = gated ? base + l.dh : nullptr;
  e.n = n;
  e.rows = rows;
  e.l1 = l1;
  launch_dense_backward_hidden(e, device_, s);

  // dx = [dg | du] [Wg; Wu] (one GEMM of depth 2N over a copy of the two weights, or over the
  // weights themselves where Wu follows Wg in memory, as a fused gate-up parameter has them);
  // plain: dg Wu
  const void* stacked = first_weight();
  if (copies_weights()) {
    const size_t bytes = size_t(n * k) * es;
    check_cuda(cudaMemcpyAsync(base + l.stacked, weights_.gate.data, bytes, cudaMemcpyDeviceToDevice, s),
               kBackwardOp, "stacked weights");
    check_cuda(cudaMemcpyAsync(base + l.stacked + bytes, weights_.up.data, bytes, cudaMemcpyDeviceToDevice, s),
               kBackwardOp, "stacked weights");
    stacked = base + l.stacked;
  }
  lt_->run(matmul_call(GemmId::grad_input, rows, k, gated ? 2 * n : n, q, stacked, g.dx), s, base + l.lt);

  // dW1 = dg^T x;  gated: dWu = du^T x (one GEMM into [dWg; dWu] where dWu follows dWg in memory);
  // dWd = h^T dy
  const int64_t ldq = gated ? 2 * n : n;
  void* ws = base + l.lt;
  const bool adjacent_grads = gated && g.dup == g.dfirst + n * k;
  blas_->weight_grad(q, ldq, x.data, rows, adjacent_grads ? 2 * n : n, k, g.dfirst, 0.0f, s, ws,
                     LtConfig::kWorkspaceBytes);
  if (gated && !adjacent_grads)
    blas_->weight_grad(q + size_t(n) * es, ldq, x.data, rows, n, k, g.dup, 0.0f, s, ws,
                       LtConfig::kWorkspaceBytes);
  blas_->weight_grad(h, n, args.dy.data, rows, n, k, g.ddown, 0.0f, s, ws, LtConfig::kWorkspaceBytes);
}

}  // namespace

}  // namespace twell::gpu

namespace twell::detail {

std::unique_ptr<TrainingBackend> make_cuda_training(const FfnWeights& w, const TrainingOptions& o) {
  return std::make_unique<gpu::CudaTraining>(w, o);
}

}  // namespace twell::detail
