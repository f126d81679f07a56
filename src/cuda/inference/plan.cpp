// The CUDA inference backend: checks what the kernels support, sizes the workspace and enqueues
// one path per run on the caller's stream, with no host synchronisation (graph-capturable):
//   sparse: G = x W1^T (cuBLASLt) -> TwELL pack of relu(G) -> compact up+down -> routed-row
//           backup; on sm_90a the gate GEMM packs TwELL itself (gate_pack.cu), G holds only
//           routed rows
//   decode (the sparse path of M <= DecodeConfig::kMaxRows): G (cuBLASLt) ->
//           active lists and up dots per (token, neuron chunk) -> down axpys per column slice;
//           up to FusedDecodeConfig::kMaxRows rows (GateKernel::automatic) one cooperative kernel,
//           with nothing zeroed before it: gate (tensor cores, W1 into registers, x in shared memory)
//           -> up dots of the active rows -> grid barrier -> down rows
//   dense:  G (cuBLASLt) [-> U = x Wu^T] -> h = relu(G) [* U] -> y = h Wd (cuBLASLt)
// W1 is the gate weight (gated) or the up weight (plain). docs/kernels.md has the reasoning.
// The ReLU is twell's own (relu in element.cuh: NaN stays NaN), never cuBLASLt's epilogue; a row
// with a NaN or infinite gate value is routed to the dense backup, which multiplies every relu(g)
// by its u: NaN and Inf in x or a NaN gate weight reach y as in the dense computation.
#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <string>

#include "core/backend.hpp"
#include "cuda/inference/workspace.hpp"
#include "cuda/kernels/inference.hpp"
#include "cuda/policy/calibration.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"
#include "cuda/runtime/device.hpp"
#include "cuda/runtime/lt_gemm.hpp"
#include "cuda/runtime/run_order.hpp"

namespace twell::gpu {

namespace {

constexpr const char* kPlanOp = "InferencePlan";
constexpr const char* kRunOp = "InferencePlan::run";

class CudaInference final : public detail::InferenceBackend {
 public:
  CudaInference(const FfnWeights& w, const InferenceOptions& o)
      : weights_(w),
        options_(o),
        dims_(supported_dims(w, o.tile, o.capacity, kPlanOp)),
        device_(query_device(w.up.device.index, kPlanOp)),
        dense_above_(o.dense_above),
        fused_gate_(o.gate == GateKernel::automatic && gate_pack_available(device_)) {
    DeviceGuard guard(device_.index, kPlanOp);
    check_weight_pointers(w, device_.index, kPlanOp);
    lt_ = std::make_unique<LtGemm>(dims_.dtype);
    calibration_ = std::make_unique<DispatchCalibration>();
    order_ = std::make_unique<RunOrder>(kPlanOp);
    if (o.gate == GateKernel::automatic && o.dispatch != Dispatch::force_dense)
      fused_decode_ = fused_decode_setup(dims_.kind, dims_.dtype, dims_.k, dims_.n, device_);
  }

  size_t workspace_bytes(int64_t rows) const override {
    check_rows(rows, "InferencePlan::workspace_bytes");
    return workspace_layout(dims_, rows, paths_for(options_.dispatch)).bytes;
  }

  void* own_workspace(size_t bytes, Stream stream) override {
    DeviceGuard guard(device_.index, kRunOp);
    const cudaStream_t s = resolve_stream(stream);
    return order_->own_workspace(bytes, s, is_capturing(s, kRunOp), kRunOp);
  }

  RunInfo run(const InferenceArgs& args, Stream stream, void* workspace) override;
  // Runs read weights_ only while enqueuing: a rebind between runs (captured or not) is safe.
  void set_weights(const FfnWeights& w) override {
    rebound_.rebound(w, "InferencePlan::set_weights");
    weights_ = w;
  }

 private:
  struct Buffers {
    RunCounters* control = nullptr;
    void* lt = nullptr;
    void* hidden = nullptr;
    char* base = nullptr;
    WorkspaceLayout layout;
  };

  // The run's path, and under automatic dispatch how an eager run is measured.
  DispatchCalibration::Choice choose(int64_t rows, bool capturing) {
    DispatchCalibration::Choice c;
    switch (options_.dispatch) {
      case Dispatch::force_dense: c.dense = true; break;
      case Dispatch::force_sparse: break;
      case Dispatch::automatic: c = calibration_->choose(rows, dense_above_, capturing); break;
    }
    return c;
  }

  void check_pointers(const InferenceArgs& args, int64_t rows) const {
    if (args.counters.defined())
      check_device_pointer(args.counters.data, device_.index, kRunOp, "counters");
    if (rows == 0) return;
    check_device_pointer(args.x.data, device_.index, kRunOp, "x");
    check_device_pointer(args.y.data, device_.index, kRunOp, "y");
  }

  // The run's TwELL layout in the workspace.
  TwellView packed_view(int64_t rows, const Buffers& b) const {
    TwellView tw;
    tw.shape.rows = rows;
    tw.shape.cols = dims_.n;
    tw.shape.tile = dims_.tile;
    tw.shape.capacity = dims_.capacity;
    tw.dtype = dims_.dtype;
    tw.device = Device::cuda(device_.index);
    tw.values = b.base + b.layout.values;
    tw.cols = reinterpret_cast<uint16_t*>(b.base + b.layout.cols);
    tw.counts = reinterpret_cast<uint16_t*>(b.base + b.layout.counts);
    tw.row_slot = reinterpret_cast<int32_t*>(b.base + b.layout.row_slot);
    tw.routed_rows = reinterpret_cast<int32_t*>(b.base + b.layout.routed_rows);
    tw.num_routed = &b.control->num_routed;
    return tw;
  }

  // The most entries of a compact row one warp of the row kernels takes (RowConfig::kLongRow;
  // under Determinism::fast it follows the last measured density).
  int32_t long_row() const { return long_row_limit(calibration_->density(), dims_.n, options_.determinism); }

  const void* first_weight() const {
    return dims_.kind == FfnKind::gated ? weights_.gate.data : weights_.up.data;
  }
  void run_gate(const InferenceArgs& args, int64_t rows, const Buffers& b, cudaStream_t s) {
    lt_->run(linear_call(GemmId::gate, rows, dims_.n, dims_.k, args.x.data, first_weight(),
                         b.hidden),
             s, b.lt);
  }
  // The run's counters (and the decode path's arrivals) zeroed: every path but the fused decode kernel.
  void zero_control(const Buffers& b, cudaStream_t s) {
    check_cuda(cudaMemsetAsync(b.base + b.layout.control, 0, b.layout.control_bytes, s), kRunOp, "run counters");
  }
  bool fused_decode_for(int64_t rows) const {
    return rows <= FusedDecodeConfig::kMaxRows && fused_decode_[size_t(rows)].ctas > 0;
  }
  void run_sparse(const InferenceArgs& args, int64_t rows, const Buffers& b, bool capturing, cudaStream_t s);
  // False when the device refused the cooperative grid (nothing enqueued; the plan stops trying).
  bool run_fused_decode(const InferenceArgs& args, int64_t rows, const Buffers& b, cudaStream_t s);
  void run_decode(const InferenceArgs& args, int64_t rows, const Buffers& b, cudaStream_t s);
  DecodeProblem decode_problem(const InferenceArgs& args, int64_t rows, const Buffers& b) const;
  void run_dense(const InferenceArgs& args, int64_t rows, const Buffers& b, cudaStream_t s);

  FfnWeights weights_;
  ReboundWeights rebound_;
  InferenceOptions options_;
  ProblemDims dims_;
  DeviceInfo device_;
  double dense_above_;
  bool fused_gate_;  // the sparse path's gate GEMM packs TwELL in its epilogue (gate_pack.cu)
  std::unique_ptr<LtGemm> lt_;
  std::unique_ptr<DispatchCalibration> calibration_;
  RoutedCapacity routed_capacity_{kRunOp, options_.determinism};  // how many backup rows cuBLAS takes
  std::unique_ptr<RunOrder> order_;  // runs across streams; the plan's own workspace
  std::unique_ptr<GraphTrial> graph_trial_;  // dispatch's graph-timed trials (made on first use)
  // The fused decode kernel's grid per M (ctas = 0: the two-kernel decode path).
  FusedDecodeLaunches fused_decode_{};
};

RunInfo CudaInference::run(const InferenceArgs& args, Stream stream, void* workspace) {
  const int64_t rows = args.x.shape[0];
  RunInfo info;
  info.rows = rows;
  info.routed_rows = -1;  // known on the device only (see args.counters)
  info.active = -1;
  DeviceGuard guard(device_.index, kRunOp);
  const cudaStream_t s = resolve_stream(stream);
  const bool capturing = is_capturing(s, kRunOp);
  if (!capturing) check_pointers(args, rows);
  rebound_.before_call(weights_, device_.index, capturing, kRunOp);
  check_rows(rows, kRunOp);
  auto* counters = static_cast<int64_t*>(args.counters.data);
  if (rows == 0) {
    if (counters != nullptr)
      check_cuda(cudaMemsetAsync(counters, 0, 2 * sizeof(int64_t), s), kRunOp, "counters");
    info.routed_rows = 0;
    info.active = 0;
    info.ran_dense = options_.dispatch == Dispatch::force_dense;
    return info;
  }
  // Runs on different streams share the plan's workspace and calibration slot: order them.
  order_->begin(s, capturing, kRunOp);

  const DispatchCalibration::Choice choice = choose(rows, capturing);
  const bool dense = choice.dense;
  Buffers b;
  b.layout = workspace_layout(dims_, rows, paths_for(options_.dispatch));
  b.base = aligned_base(workspace);
  b.control = reinterpret_cast<RunCounters*>(b.base + b.layout.control);
  b.lt = b.base + b.layout.lt;
  b.hidden = b.base + b.layout.hidden;
  // The run's work on a stream; `in_graph`: inside a capture (the caller's or a graph trial's).
  const auto enqueue = [&](cudaStream_t on, bool in_graph) {
    // The fused decode kernel zeroes nothing beforehand and writes the run's counters itself.
    if (!dense && fused_decode_for(rows) && run_fused_decode(args, rows, b, on)) return;
    zero_control(b, on);
    if (dense)
      run_dense(args, rows, b, on);
    else if (rows <= DecodeConfig::kMaxRows)
      run_decode(args, rows, b, on);
    else
      run_sparse(args, rows, b, in_graph, on);
    if (counters != nullptr) launch_write_counters(b.control, counters, on);
  };
  // Eager runs under automatic dispatch: the count probed, trials timed as they run or as a graph.
  const bool calibrate = !capturing && options_.dispatch == Dispatch::automatic;
  const auto finish = [&](cudaStream_t on) { calibration_->finish(&b.control->active, rows, dims_.n, dense, on); };
  if (choice.graph) {
    if (!graph_trial_) graph_trial_ = std::make_unique<GraphTrial>(kRunOp);
    graph_trial_->run(
        s, [&](cudaStream_t on) { enqueue(on, true); }, [&](cudaStream_t on) { calibration_->start(choice, on); },
        finish);
  } else {
    if (calibrate) calibration_->start(choice, s);
    enqueue(s, capturing);
    if (calibrate) finish(s);
  }
  order_->end(s, capturing, kRunOp);
  info.ran_dense = dense;
  return info;
}

void CudaInference::run_sparse(const InferenceArgs& args, int64_t rows, const Buffers& b, bool capturing,
                               cudaStream_t s) {
  const TwellView tw = packed_view(rows, b);

  // K a multiple of 256: the warp-per-row kernels (in column ranges of 2048 for larger K); up to
  // K = 2048 they also run the moderately dense routed rows from G. They hand the rows over
  // N / RowConfig::kDenseRowDivisor active neurons (compact or routed; for larger K every routed
  // row) to the tensor-core backup in their heavy list. Other K: one CTA per compact row, and
  // every routed row goes to the backup.
  const bool row_kernel = row_kernel_supports(dims_.kind, dims_.k, dims_.n);
  // The dots kernel overlapped with the fused gate: it starts on the SMs the gate frees in its last
  // wave and takes each row block as the gate releases it (docs/kernels.md).
  const bool overlap =
      fused_gate_ && row_kernel && row_kernel_splits(dims_.kind, dims_.n) && gate_overlap_enabled();
  auto* ready = reinterpret_cast<int32_t*>(b.base + b.layout.ready);
  if (fused_gate_) {
    GatePackArgs gate;
    gate.kind = dims_.kind;
    gate.x = args.x.data;
    gate.weight = first_weight();
    gate.k = dims_.k;
    gate.out = tw;
    gate.hidden = b.hidden;
    gate.active = &b.control->active;
    if (overlap) gate.ready = ready;
    launch_gate_pack(gate, device_, s);
    // Rows with an overflowing tile become routed: here, or with the overlap between the row
    // kernel's first dots pass and the rest (launch_row_ffn, route_overflow).
    if (!overlap) launch_route_overflow(tw, b.hidden, device_, s, kRunOp);
  } else {
    run_gate(args, rows, b, s);
    PackArgs pack;
    pack.kind = dims_.kind;
    pack.hidden = b.hidden;
    pack.out = tw;
    pack.active = &b.control->active;
    launch_pack(pack, device_, s);
  }

  CompactArgs compact;
  compact.kind = dims_.kind;
  compact.x = args.x.data;
  compact.up = weights_.up.data;
  compact.down = weights_.down.data;
  compact.y = args.y.data;
  compact.hidden = dims_.k;
  compact.twell = tw;
  auto* heavy = reinterpret_cast<int32_t*>(b.base + b.layout.heavy_rows);
  if (row_kernel) {
    RowArgs row;
    row.compact = compact;
    row.hidden = b.hidden;
    row.heavy_rows = heavy;
    row.long_rows = reinterpret_cast<int32_t*>(b.base + b.layout.long_rows);
    row.control = b.control;
    if (overlap) {
      row.ready = ready;
      row.ready_target = gate_ready_target(dims_.n);
      row.route_overflow = true;
    }
    row.long_row = long_row();
    launch_row_ffn(row, device_, s);
  } else {
    launch_compact_ffn(compact, s);
  }

  // The backup: the first C rows through cuBLAS, C learned from earlier runs' counts; the rest
  // (all of them until a count arrives) on the tensor-core kernel.
  const int32_t* backup_count = row_kernel ? &b.control->num_heavy : tw.num_routed;
  RoutedArgs routed = routed_args(dims_, weights_, args.x.data, args.y.data, b.hidden, rows,
                                  row_kernel ? heavy : tw.routed_rows, backup_count);
  routed.split_k = {reinterpret_cast<float*>(b.base + b.layout.split_partials), b.control->split_tiles};
  routed.first = routed_capacity_.capacity(rows, b.layout.blas_rows, capturing);
  launch_routed_blas(*lt_, routed, routed.first, b.base + b.layout.routed_blas, b.lt, device_, s, kRunOp);
  launch_routed(routed, device_, s);
  routed_capacity_.record(backup_count, rows, capturing, s);
}

bool CudaInference::run_fused_decode(const InferenceArgs& args, int64_t rows, const Buffers& b, cudaStream_t s) {
  FusedDecodeArgs f;
  static_cast<DecodeProblem&>(f) = decode_problem(args, rows, b);
  f.first = first_weight();
  f.h = reinterpret_cast<float*>(b.base + b.layout.decode_h);
  f.bitmap = reinterpret_cast<uint32_t*>(b.base + b.layout.decode_bitmap);
  f.counters = static_cast<int64_t*>(args.counters.data);
  if (launch_fused_decode(f, fused_decode_[size_t(rows)], s)) return true;
  fused_decode_[size_t(rows)].ctas = 0;  // refused (fewer SMs than at setup): two kernels from now on
  return false;
}

void CudaInference::run_decode(const InferenceArgs& args, int64_t rows, const Buffers& b, cudaStream_t s) {
  run_gate(args, rows, b, s);
  DecodeArgs d;
  static_cast<DecodeProblem&>(d) = decode_problem(args, rows, b);
  d.hidden = b.hidden;
  d.chunks = DecodeConfig::chunks(dims_.n);
  d.counts = reinterpret_cast<int32_t*>(b.base + b.layout.decode_counts);
  d.neurons = reinterpret_cast<int32_t*>(b.base + b.layout.decode_neurons);
  d.h = reinterpret_cast<float*>(b.base + b.layout.decode_h);
  d.partials = reinterpret_cast<float*>(b.base + b.layout.decode_partials);
  d.arrivals = reinterpret_cast<int32_t*>(b.base + b.layout.decode_arrivals);
  launch_decode(d, device_, s);
}

DecodeProblem CudaInference::decode_problem(const InferenceArgs& args, int64_t rows, const Buffers& b) const {
  DecodeProblem p;
  static_cast<UpDownProblem&>(p) = up_down_problem(dims_, weights_, args.x.data, args.y.data, rows);
  p.active = &b.control->active;
  return p;
}

void CudaInference::run_dense(const InferenceArgs& args, int64_t rows, const Buffers& b, cudaStream_t s) {
  run_gate(args, rows, b, s);
  DenseHiddenArgs h;
  h.kind = dims_.kind;
  h.dtype = dims_.dtype;
  h.hidden = b.hidden;
  h.elements = rows * dims_.n;
  h.active = &b.control->active;
  if (dims_.kind == FfnKind::gated) {
    void* up = b.base + b.layout.up;
    lt_->run(linear_call(GemmId::up, rows, dims_.n, dims_.k, args.x.data, weights_.up.data, up), s, b.lt);
    h.up = up;
  }
  launch_dense_hidden(h, device_, s);  // relu(G) (* U) in place, and the active count
  lt_->run(matmul_call(GemmId::down, rows, dims_.k, dims_.n, b.hidden, weights_.down.data, args.y.data), s,
           b.lt);
}

}  // namespace

}  // namespace twell::gpu

namespace twell::detail {

std::unique_ptr<InferenceBackend> make_cuda_inference(const FfnWeights& w,
                                                      const InferenceOptions& o) {
  return std::make_unique<gpu::CudaInference>(w, o);
}

}  // namespace twell::detail
