// The CUDA training plan and its compact-form pipelines (backend.hpp has the class).
//   forward:  G = x W1^T (cuBLASLt) -> TwELL pack of relu(G) into `saved` (plane 0 = g) -> compact rows:
//             u into plane 1, y, per-row L1 -> routed rows: inference's dense backup (y, h in G)
//             -> statistics {L0, L1}                                          (forward_compact)
//   backward: column index -> compact rows: dh per entry, dx -> per-neuron weight gradients
//             (written) -> routed rows recomputed densely from x and dy: g, u, dh -> dg, du, h ->
//             dx rows, weight gradients (added; routed.cpp) -> the NaNs of compact rows whose dy
//             is not finite (launch_nonfinite_dy)                             (backward_compact)
// The dense saved form (backup_capacity == M; automatic dispatch asks for it above dense_above):
// dense.cpp. Nothing depends on the order of an atomic or a float reduction across CTAs.
// Determinism::fast (the default) runs the first C routed rows' dense products through cuBLAS, C
// learned from earlier steps' counts, and routes compact rows of many entries too (route_above):
// a routed row's rounding can change once C does. Determinism::deterministic keeps both off:
// bit-identical reruns. docs/training.md has the reasoning.
#include <algorithm>
#include <cstddef>
#include <iterator>
#include <string>

#include "cuda/inference/workspace.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/policy/train_config.hpp"
#include "cuda/runtime/cuda_check.hpp"
#include "cuda/training/backend.hpp"

namespace twell::gpu::training {

namespace {

// Element-wise buffers: device memory of the plan's device, no vector alignment needed.
void check_buffer(const void* p, int device, const char* op, const char* name) {
  check_device_pointer(p, device, op, name, 1);
}

void check_saved_memory(const TwellView& v, int device, const char* op) {
  check_buffer(v.num_routed, device, op, "saved num_routed");
  if (v.shape.rows == 0) return;
  check_buffer(v.values, device, op, "saved values");
  check_buffer(v.cols, device, op, "saved cols");
  check_buffer(v.counts, device, op, "saved counts");
  check_buffer(v.row_slot, device, op, "saved row_slot");
  check_buffer(v.routed_rows, device, op, "saved routed_rows");
  if (v.shape.backup_capacity > 0) check_buffer(v.backup, device, op, "saved backup");
}

Grads grads_of(const TrainingBackwardArgs& a, FfnKind kind) {
  const bool gated = kind == FfnKind::gated;
  Grads g;
  g.dx = a.dx.data;
  g.dfirst = static_cast<float*>(gated ? a.dgate.data : a.dup.data);
  g.dup = gated ? static_cast<float*>(a.dup.data) : nullptr;
  g.ddown = static_cast<float*>(a.ddown.data);
  return g;
}

}  // namespace

CudaTraining::CudaTraining(const FfnWeights& w, const TrainingOptions& o)
    : weights_(w),
      options_(o),
      dims_(supported_dims(w, o.tile, o.capacity, kPlanOp)),
      device_(query_device(w.up.device.index, kPlanOp)),
      fused_gate_(o.gate == GateKernel::automatic && gate_pack_available(device_)) {
  DeviceGuard guard(device_.index, kPlanOp);
  check_weight_pointers(w, device_.index, kPlanOp);
  lt_ = std::make_unique<LtGemm>(dims_.dtype);
  blas_ = std::make_unique<BlasGemm>(dims_.dtype);
  order_ = std::make_unique<RunOrder>(kPlanOp);
  check_cuda(cudaMalloc(&fault_flag_, sizeof(SavedFault)), kPlanOp, "saved-state fault flag");
  check_cuda(cudaHostAlloc(&fault_report_, sizeof(SavedFault), cudaHostAllocMapped), kPlanOp,
             "saved-state fault report");
  *fault_report_ = SavedFault{};
}

CudaTraining::~CudaTraining() {
  if (fault_flag_ != nullptr) cudaFree(fault_flag_);
  if (fault_report_ != nullptr) cudaFreeHost(fault_report_);
}

size_t CudaTraining::workspace_bytes(int64_t rows, SavedForm form, TrainingCall call) const {
  // Either form's forward carves the forward layout (the dense form's G and h too).
  const size_t forward = train_forward_layout(dims_, rows).bytes;
  const size_t backward = form == SavedForm::dense ? dense_backward_layout(rows).bytes
                                                   : train_backward_layout(dims_, rows).bytes;
  if (call == TrainingCall::forward) return forward;
  if (call == TrainingCall::backward) return backward;
  return std::max(forward, backward);
}

bool CudaTraining::wants_dense_layout(int64_t rows) {
  if (rows == 0 || options_.dispatch == Dispatch::force_sparse) return false;
  if (options_.dispatch == Dispatch::force_dense) return true;
  return calibration_.prefer_dense(rows, options_.dense_above);
}

int32_t CudaTraining::compact_capacity(int64_t rows) {
  if (rows == 0 || options_.min_capacity == options_.capacity) return options_.capacity;
  // The density as wants_dense_layout just polled it (saved_shape asks that first).
  return saved_capacity_.capacity(calibration_.density());
}

void CudaTraining::seal_saved(const TwellView& saved, const TwellHeader& header, Stream stream) {
  DeviceGuard guard(device_.index, kForwardOp);
  launch_write_header(saved.header, header, resolve_stream(stream), kForwardOp);
}

void CudaTraining::check_saved(const TwellView& saved, const TwellHeader& expected, Stream stream) {
  if (saved.shape.rows == 0) return;  // backward reads nothing of an empty state
  DeviceGuard guard(device_.index, kBackwardOp);
  launch_saved_check({saved, expected, fault_flag_, fault_report_}, device_, resolve_stream(stream));
}

// The report is host-mapped: reading it needs no synchronisation; a fault shows here once the
// check that found it has run.
void CudaTraining::raise_reported_fault(const char* op) {
  const volatile SavedFault* r = fault_report_;
  const int32_t code = r->code;
  if (code == 0) return;
  const int64_t row = r->row, value = r->value;
  *fault_report_ = SavedFault{};
  static constexpr const char* kWhat[] = {"", "header word", "num_routed", "routed_rows entry", "row_slot",
                                          "count", "column"};
  const bool known = code > 0 && code < int32_t(std::size(kWhat));
  // The header's owner word differs alone when another plan's forward wrote the state.
  const bool owner = code == int32_t(SavedFaultCode::header) &&
                     value == int64_t(offsetof(TwellHeader, owner) / sizeof(uint64_t));
  throw Error(op, "saved", "the state a forward of this plan wrote (checked on the device before backward)",
              std::string("a corrupted or foreign buffer: ") + (known ? kWhat[code] : "fault") + " " +
                  std::to_string(value) + (row >= 0 ? " at row " + std::to_string(row) : std::string()) +
                  (owner ? " (the header owner: another plan's state)" : ""));
}

std::shared_ptr<void> CudaTraining::allocate(size_t bytes) {
  DeviceGuard guard(device_.index, kForwardOp);
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), kForwardOp, "saved activations");
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

int64_t CudaTraining::routed_rows(const TwellView& saved) {
  const char* op = "SavedActivations::routed_rows";
  DeviceGuard guard(device_.index, op);
  check_cuda(cudaDeviceSynchronize(), op, "device synchronisation");
  raise_reported_fault(op);
  int32_t routed = 0;
  check_cuda(cudaMemcpy(&routed, saved.num_routed, sizeof routed, cudaMemcpyDeviceToHost), op,
             "routed row count");
  return routed;
}

char* CudaTraining::begin(int64_t rows, const TensorView& caller, cudaStream_t s, bool capturing,
                          const char* op) {
  // Runs on different streams share the plan's workspace: order them.
  order_->begin(s, capturing, op);
  if (caller.defined()) return aligned_base(caller.data);
  // Sized for every form dispatch may pick (it persists from run to run, and a capture cannot grow it).
  return aligned_base(order_->own_workspace(any_form_workspace_bytes(rows), s, capturing, op));
}

bool CudaTraining::copies_weights() const {
  return dims_.kind == FfnKind::gated &&
         static_cast<const char*>(weights_.up.data) !=
             static_cast<const char*>(weights_.gate.data) + size_t(dims_.n * dims_.k) * dtype_size(dims_.dtype);
}

int32_t CudaTraining::route_above() const {
  if (options_.determinism != Determinism::fast) return -1;
  return int32_t(std::clamp<int64_t>(dims_.n / TrainRowConfig::kRouteRowDivisor, TrainRowConfig::kRouteRowMin,
                                     TrainRowConfig::kRouteRowMax));
}

void CudaTraining::forward(const TrainingForwardArgs& args, const TwellView& saved, Stream stream) {
  DeviceGuard guard(device_.index, kForwardOp);
  const cudaStream_t s = resolve_stream(stream);
  const bool capturing = is_capturing(s, kForwardOp);
  rebound_.before_call(weights_, device_.index, capturing, kForwardOp);
  const int64_t rows = args.x.shape[0];
  check_rows(rows, kForwardOp);
  auto* stats = static_cast<float*>(args.stats.data);
  if (!capturing) {
    if (stats != nullptr) check_buffer(stats, device_.index, kForwardOp, "stats");
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
    forward_compact(args, saved, rows, base, capturing, s);
  if (calibrate)
    calibration_.forward_finish(active, rows, dims_.n, saved.shape.backup_capacity == rows, s);
  order_->end(s, capturing, kForwardOp);
}

void CudaTraining::forward_compact(const TrainingForwardArgs& args, const TwellView& saved, int64_t rows,
                                   char* base, bool capturing, cudaStream_t s) {
  const TrainForwardLayout l = train_forward_layout(dims_, rows);
  auto* active = at<unsigned long long>(base, l.active);
  void* hidden = base + l.hidden;
  auto* stats = static_cast<float*>(args.stats.data);
  float* row_l1 = stats != nullptr ? at<float>(base, l.row_l1) : nullptr;

  // 1. Gate and pack: plane 0 of `saved`; G holds the routed rows' relu(G).
  if (fused_gate_) {  // the gate GEMM packs plane 0 itself
    launch_gate_pack({kForwardOp, dims_.kind, args.x.data, first_weight(), dims_.k, saved, hidden, active},
                     device_, s);
    launch_route_overflow(saved, hidden, device_, s, kForwardOp, route_above());
  } else {
    lt_->run(linear_call(GemmId::gate, rows, dims_.n, dims_.k, args.x.data, first_weight(), hidden), s,
             base + l.lt);
    launch_pack({dims_.kind, hidden, saved, active}, device_, s);
    if (const int32_t above = route_above(); above >= 0)
      launch_route_overflow(saved, hidden, device_, s, kForwardOp, above);
  }

  // 2. Compact rows: u into plane 1, y, per-row L1.
  const CompactArgs compact{dims_.kind, args.x.data, weights_.up.data, weights_.down.data, args.y.data,
                            dims_.k, saved};
  launch_forward_rows({compact, row_l1, at<int32_t>(base, l.control), at<int32_t>(base, l.long_rows)}, device_,
                      s);

  // 3. Routed rows: the dense backup (the first C through cuBLAS), then listed in ascending order.
  RoutedArgs routed = routed_args(dims_, weights_, args.x.data, args.y.data, hidden, rows,
                                  saved.routed_rows, saved.num_routed);
  routed.split_k = {at<float>(base, l.split_partials), at<int32_t>(base, l.split_counters)};
  routed.first = routed_capacity_.capacity(rows, l.blas_rows, capturing);
  launch_routed_blas(*lt_, routed, routed.first, base + l.routed_blas, base + l.lt, device_, s, kForwardOp);
  launch_routed(routed, device_, s);
  launch_routed_renumber(saved, s);
  routed_capacity_.record(saved.num_routed, rows, capturing, s);
  if (!capturing && options_.min_capacity < options_.capacity)
    saved_capacity_.record(saved.num_routed, rows, saved.shape.capacity, s);

  // 4. Statistics.
  launch_statistics(saved, hidden, active, row_l1, stats, rows, s);
}

void CudaTraining::launch_statistics(const TwellView& saved, const void* hidden,
                                     const unsigned long long* active, float* row_l1, float* stats,
                                     int64_t rows, cudaStream_t s, int64_t partials) {
  if (stats == nullptr) return;
  launch_stats({dims_.dtype, hidden, dims_.n, rows, saved.routed_rows, saved.num_routed, active, row_l1, stats,
                partials},
               device_, s);
}

void CudaTraining::backward(const TrainingBackwardArgs& args, const TensorView& x, const TwellView& saved,
                            Stream stream) {
  DeviceGuard guard(device_.index, kBackwardOp);
  const cudaStream_t s = resolve_stream(stream);
  const bool capturing = is_capturing(s, kBackwardOp);
  rebound_.before_call(weights_, device_.index, capturing, kBackwardOp);
  const int64_t rows = x.shape[0];
  check_rows(rows, kBackwardOp);
  const Grads g = grads_of(args, dims_.kind);
  const auto* l1_device = static_cast<const float*>(args.l1_coef.data);
  if (!capturing) {
    if (dims_.kind == FfnKind::gated) check_device_pointer(args.dgate.data, device_.index, kBackwardOp, "dgate");
    check_device_pointer(args.dup.data, device_.index, kBackwardOp, "dup");
    check_device_pointer(args.ddown.data, device_.index, kBackwardOp, "ddown");
    if (l1_device != nullptr) check_buffer(l1_device, device_.index, kBackwardOp, "l1_coef");
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
  const L1Coef l1{l1_device, float(options_.l1_coef)};
  if (saved.shape.backup_capacity == rows)
    backward_dense(args, x, saved, g, rows, base, l1, s);
  else
    backward_compact(args, x, saved, g, rows, base, l1, capturing, s);
  if (calibrate) calibration_.backward_finish(s);
  order_->end(s, capturing, kBackwardOp);
}

void CudaTraining::backward_compact(const TrainingBackwardArgs& args, const TensorView& x,
                                    const TwellView& saved, const Grads& g, int64_t rows, char* base,
                                    const L1Coef& l1, bool capturing, cudaStream_t s) {
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

  // 1. The column index (it reads the layout alone): the row kernels store each entry's record
  //    where it says.
  const ColumnIndexArgs index{saved,
                              at<int32_t>(base, l.block_counts),
                              at<int32_t>(base, l.col_totals),
                              at<int64_t>(base, l.col_ptr),
                              at<int32_t>(base, l.heavy),
                              at<int32_t>(base, l.position)};
  launch_column_index(index, s);

  // 2. Compact rows: dh per entry (in its record), dx.
  auto* records = at<EntryRecord>(base, l.records);
  auto* control = at<int32_t>(base, l.control);
  launch_backward_rows({dims_.kind, args.dy.data, first_weight(), weights_.up.data, weights_.down.data, args.dx.data,
                        index.col_ptr, index.position, records, l1, dims_.k, saved, control,
                        at<int32_t>(base, l.long_rows)},
                       device_, s);

  // 3. Per-neuron weight gradients of the compact entries (written).
  launch_weight_grads({dims_.kind, dims_.dtype, x.data, args.dy.data, dims_.n, index.col_ptr, index.heavy, records,
                       index.block_counts, rows, at<int32_t>(base, l.queue), g.dfirst, g.dup, g.ddown, dims_.k},
                      device_, s);

  // 4. Routed rows, recomputed densely (added).
  backward_routed(x.data, args.dy.data, g, rb, rows, l1, s);

  // 5. Compact rows whose dy is not finite: their gradients' NaNs.
  launch_nonfinite_dy({dims_.kind, args.dy.data, saved, args.dx.data, g.dup, g.ddown, dims_.k,
                       control + kNonFiniteDyWord},
                      device_, s);
}

}  // namespace twell::gpu::training

namespace twell::detail {

std::unique_ptr<TrainingBackend> make_cuda_training(const FfnWeights& w, const TrainingOptions& o) {
  return std::make_unique<gpu::training::CudaTraining>(w, o);
}

}  // namespace twell::detail
