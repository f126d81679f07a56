// The training plan: validation and backend dispatch for forward (saving the hybrid layout) and
// backward.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/capacity.hpp"
#include "core/check.hpp"
#include "core/checked.hpp"
#include "core/policy.hpp"
#include "format/validate.hpp"
#include "twell/training.hpp"

namespace twell {

using detail::saved_capacities;

SavedActivations::SavedActivations() : impl_(std::make_unique<Impl>()) {}
SavedActivations::~SavedActivations() = default;
SavedActivations::SavedActivations(SavedActivations&&) noexcept = default;
SavedActivations& SavedActivations::operator=(SavedActivations&&) noexcept = default;
size_t SavedActivations::bytes() const { return impl_->bytes; }
int64_t SavedActivations::routed_rows() const {
  return impl_->backend ? impl_->backend->routed_rows(impl_->view) : 0;
}

namespace detail {

TrainingOptions resolve_training_options(const TrainingOptions& o, Device dev) {
  InferenceOptions io;
  io.tile = o.tile;
  io.capacity = o.capacity;
  if (o.capacity == 0)  // training's own default (policy.hpp); resolve_inference_options checks it
    io.capacity = std::max(1, (o.tile == 0 ? policy::kDefaultTile : o.tile) / policy::kTrainingCapacityDivisor);
  io = resolve_inference_options(io, dev, "TrainingPlan");
  TrainingOptions r = o;
  r.tile = io.tile;
  r.capacity = io.capacity;
  // The capacities automatic dispatch may size the compact state to (capacity.hpp): only under
  // automatic dispatch on CUDA; by default only a default capacity, down to tile / 64 but not
  // below kTrainingMinCapacity, and any capacity down to a min_capacity given.
  if (r.min_capacity < 0 || r.min_capacity > r.capacity)
    throw Error("TrainingPlan", "options.min_capacity",
                "0 (the default) or 1.." + std::to_string(r.capacity) + " (at most the capacity)",
                std::to_string(r.min_capacity));
  if (o.dispatch != Dispatch::automatic || dev.type != DeviceType::cuda)
    r.min_capacity = r.capacity;
  else if (r.min_capacity == 0)
    r.min_capacity = o.capacity != 0 ? r.capacity
                                     : std::min(r.capacity, std::max(policy::kTrainingMinCapacity,
                                                                     r.tile / policy::kTrainingMinCapacityDivisor));
  if (!(r.l1_coef >= 0.0) || !std::isfinite(r.l1_coef))
    throw Error("TrainingPlan", "options.l1_coef", "a finite value >= 0", std::to_string(r.l1_coef));
  if (std::isnan(r.dense_above) || r.dense_above > 1.0)
    throw Error("TrainingPlan", "options.dense_above", "a density <= 1 (< 0: the default)",
                std::to_string(r.dense_above));
  if (r.dense_above < 0) r.dense_above = policy::kCudaTrainingDenseAbove;
  return r;
}

namespace {

// splitmix64's finaliser: a bijection of 64-bit words that spreads every input bit.
uint64_t mix64(uint64_t v) {
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
  return v ^ (v >> 31);
}

// The owner tag a plan writes into its saved states' headers. Without a caller's tag: bit 63 set
// and the plan's number (from 1, never reused in a process: no two plans share it). With one: bit
// 63 clear and a hash of the tag, the kind and K (plans of one tag but another kind or K refuse
// each other's states), never 0 (a header's "no owner").
uint64_t state_owner(uint64_t tag, FfnKind kind, int64_t hidden) {
  constexpr uint64_t kPlanBit = uint64_t(1) << 63;
  static std::atomic<uint64_t> next_plan{1};
  if (tag == 0) return kPlanBit | next_plan.fetch_add(1, std::memory_order_relaxed);
  const uint64_t owner = mix64(tag ^ mix64(uint64_t(kind) << 56 ^ uint64_t(hidden))) & ~kPlanBit;
  return owner != 0 ? owner : 1;
}

}  // namespace

}  // namespace detail

class TrainingPlan::Impl {
 public:
  FfnWeights weights;
  TrainingOptions options;
  std::shared_ptr<detail::TrainingBackend> backend;

  // The form of a saved view of `rows` rows (its shape is checked by check_saved).
  static SavedForm form_of(const TwellView& saved, int64_t rows) {
    return rows > 0 && saved.shape.backup_capacity == rows ? SavedForm::dense : SavedForm::compact;
  }

  void check_saved(const char* op, const TwellView& saved, int64_t rows) const {
    const TwellShape& got = saved.shape;
    const bool dense = form_of(saved, rows) == SavedForm::dense;
    if (dense && !backend->supports_dense_layout())
      throw Error(op, "saved shape", "backup 0 (this backend saves the compact form only)",
                  "backup " + std::to_string(got.backup_capacity));
    const bool listed = !dense && detail::is_saved_capacity(got.capacity, options.capacity, options.min_capacity);
    const TwellShape want = shape(rows, dense, listed ? got.capacity : options.capacity);
    auto str = [](const TwellShape& s) {
      return "rows " + std::to_string(s.rows) + ", cols " + std::to_string(s.cols) + ", tile " +
             std::to_string(s.tile) + ", capacity " + std::to_string(s.capacity) + ", planes " +
             std::to_string(s.planes) + ", backup " + std::to_string(s.backup_capacity);
    };
    if (got.rows != want.rows || got.cols != want.cols || got.tile != want.tile ||
        got.capacity != want.capacity || got.planes != want.planes ||
        got.backup_capacity != want.backup_capacity) {
      std::string capacities;
      if (!dense && options.min_capacity < options.capacity)
        for (int32_t c : saved_capacities(options.capacity, options.min_capacity))
          capacities += (capacities.empty() ? " (capacity one of " : ", ") + std::to_string(c);
      throw Error(op, "saved shape", str(want) + (capacities.empty() ? "" : capacities + ")"), str(got));
    }
    if (saved.dtype != backend->saved_dtype())
      throw Error(op, "saved dtype", dtype_name(backend->saved_dtype()), dtype_name(saved.dtype));
    if (saved.device != weights.up.device)
      throw Error(op, "saved device", to_string(weights.up.device), to_string(saved.device));
    if (!saved.values || !saved.cols || !saved.counts || !saved.row_slot || !saved.routed_rows ||
        !saved.num_routed || (want.backup_capacity > 0 && !saved.backup))
      throw Error(op, "saved", "every array of the layout", "a null pointer");
    if (!saved.header)
      throw Error(op, "saved header", "the header array (a view from make_twell_view)", "a null pointer");
    detail::check_twell_arrays(op, saved, "saved ");  // each array aligned to its element type
  }

  // The owner tag of this plan's saved states (detail::state_owner): set once, in the constructor.
  uint64_t owner = 0;

  // The header forward writes into a saved view: its shape, dtype and this plan's owner tag, so
  // backward can refuse another plan's or stale bytes.
  TwellHeader saved_header(const TwellView& saved) const {
    return make_twell_header(saved.shape, saved.dtype, owner);
  }

  void check_workspace(const char* op, const TensorView& ws, int64_t rows, const TwellView& saved,
                       TrainingCall call) const {
    if (!ws.defined()) return;
    if (auto e = detail::shape_error(op, "workspace", ws)) throw *e;
    const size_t need = backend->workspace_bytes(rows, form_of(saved, rows), call);
    if (ws.rank != 1 || ws.dtype != DType::u8 || !ws.is_contiguous())
      throw Error(op, "workspace", "a contiguous uint8 vector", ws.shape_string() + " " + dtype_name(ws.dtype));
    if (ws.device != weights.up.device)
      throw Error(op, "workspace", "device " + to_string(weights.up.device), to_string(ws.device));
    detail::check_alignment(op, "workspace", ws.data, detail::kWorkspaceAlign);
    if (size_t(ws.shape[0]) < need)
      throw Error(op, "workspace", "at least " + std::to_string(need) + " bytes",
                  std::to_string(ws.shape[0]) + " bytes");
  }

  // The first `need` bytes of a defined workspace: what the backend may write.
  detail::ByteRange workspace_range(const char* op, const TensorView& ws, int64_t rows, const TwellView& saved,
                                    TrainingCall call) const {
    const size_t need = ws.defined() ? backend->workspace_bytes(rows, form_of(saved, rows), call) : 0;
    return detail::byte_range(op, "workspace", ws.data, need, ws.device);
  }

  // No output may share a byte with an input (the weights among them) or another output.
  void check_overlaps(const char* op, std::vector<detail::ByteRange> outputs,
                      std::vector<detail::ByteRange> inputs) const {
    inputs.push_back(detail::byte_range(op, "up weight", weights.up));
    inputs.push_back(detail::byte_range(op, "down weight", weights.down));
    if (weights.kind == FfnKind::gated) inputs.push_back(detail::byte_range(op, "gate weight", weights.gate));
    detail::check_no_overlap(op, outputs, inputs);
  }

  // dense: the dense form (backup row m = row m), whose compact slots no row uses: capacity 1, so
  // that it holds little more than the dense planes. Else the compact form at `capacity`.
  TwellShape shape(int64_t rows, bool dense, int32_t capacity) const {
    dense = dense && rows > 0;
    TwellShape s;
    s.rows = rows;
    s.cols = weights.intermediate();
    s.tile = options.tile;
    s.capacity = dense ? 1 : capacity;
    s.planes = weights.kind == FfnKind::gated ? 2 : 1;
    s.backup_capacity = dense ? rows : 0;
    return s;
  }
};

TrainingPlan::TrainingPlan(const FfnWeights& weights, const TrainingOptions& options)
    : impl_(detail::make_plan_impl<Impl>(weights, options, "TrainingPlan", detail::resolve_training_options,
                                         detail::make_cpu_training, detail::make_cuda_training)) {
  impl_->owner = detail::state_owner(impl_->options.state_tag, weights.kind, weights.hidden());
}

TrainingPlan::~TrainingPlan() = default;
TrainingPlan::TrainingPlan(TrainingPlan&&) noexcept = default;
TrainingPlan& TrainingPlan::operator=(TrainingPlan&&) noexcept = default;
const TrainingOptions& TrainingPlan::options() const { return impl_->options; }
TwellShape TrainingPlan::saved_shape(int64_t rows) const {
  impl_->backend->raise_reported_fault("TrainingPlan::saved_shape");
  const bool dense = impl_->backend->wants_dense_layout(rows);
  TwellShape s = impl_->shape(rows, dense, dense ? 1 : impl_->backend->compact_capacity(rows));
  s.validate("TrainingPlan::saved_shape");  // rows, and sizes that fit in int64 bytes
  // Where a larger capacity takes the same bytes (arrays are 16-byte aligned: a few rows), that
  // one: the first of saved_shapes(rows) with this size, as a caller that kept the bytes finds it.
  if (!dense) {
    const DType dt = impl_->backend->saved_dtype();
    for (int32_t c : saved_capacities(impl_->options.capacity, impl_->options.min_capacity)) {
      const TwellShape larger = impl_->shape(rows, false, c);
      if (larger.bytes(dt) == s.bytes(dt)) return larger;
    }
  }
  return s;
}
TwellShape TrainingPlan::saved_shape(int64_t rows, SavedForm form) const {
  const TwellShape s = impl_->shape(rows, form == SavedForm::dense, impl_->options.capacity);
  s.validate("TrainingPlan::saved_shape");
  return s;
}
std::vector<TwellShape> TrainingPlan::saved_shapes(int64_t rows) const {
  std::vector<TwellShape> shapes;
  for (int32_t c : saved_capacities(impl_->options.capacity, impl_->options.min_capacity))
    shapes.push_back(impl_->shape(rows, false, c));
  if (impl_->backend->supports_dense_layout() && rows > 0) shapes.push_back(impl_->shape(rows, true, 1));
  for (const TwellShape& s : shapes) s.validate("TrainingPlan::saved_shapes");
  return shapes;
}
size_t TrainingPlan::workspace_bytes(int64_t rows) const {
  detail::check_workspace_rows("TrainingPlan::workspace_bytes", rows);
  // Either form is accepted whatever dispatch asks (forward and backward take the saved view's).
  return impl_->backend->any_form_workspace_bytes(rows);
}
size_t TrainingPlan::workspace_bytes(int64_t rows, SavedForm form, TrainingCall call) const {
  detail::check_workspace_rows("TrainingPlan::workspace_bytes", rows);
  return impl_->backend->workspace_bytes(rows, form, call);
}

void TrainingPlan::set_weights(const FfnWeights& w) {
  detail::check_rebind("TrainingPlan::set_weights", impl_->weights, w);
  impl_->weights = w;
  impl_->backend->set_weights(w);
}
DType TrainingPlan::saved_dtype() const { return impl_->backend->saved_dtype(); }

void TrainingPlan::forward(const TrainingForwardArgs& args, const TwellView& saved, Stream stream) {
  const char* op = "TrainingPlan::forward";
  const FfnWeights& w = impl_->weights;
  const Device dev = w.up.device;
  detail::check_matrix(op, "x", args.x, -1, w.hidden(), w.up.dtype, dev);
  detail::check_matrix(op, "y", args.y, args.x.shape[0], w.hidden(), w.up.dtype, dev);
  if (args.stats.defined()) detail::check_vector(op, "stats", args.stats, 2, DType::f32, dev);
  impl_->check_saved(op, saved, args.x.shape[0]);
  impl_->check_workspace(op, args.workspace, args.x.shape[0], saved, TrainingCall::forward);
  std::vector<detail::ByteRange> outputs = {detail::byte_range(op, "y", args.y),
                                            detail::byte_range(op, "stats", args.stats)};
  for (detail::ByteRange& r : detail::saved_byte_ranges(op, saved)) outputs.push_back(std::move(r));
  outputs.push_back(impl_->workspace_range(op, args.workspace, args.x.shape[0], saved, TrainingCall::forward));
  impl_->check_overlaps(op, std::move(outputs), {detail::byte_range(op, "x", args.x)});
  impl_->backend->raise_reported_fault(op);
  detail::translate_allocation_failure(op, [&] { impl_->backend->forward(args, saved, stream); });
  impl_->backend->seal_saved(saved, impl_->saved_header(saved), stream);
}

namespace {

// The L1 value's upstream gradient as the host sees it: the per-call l1_coef when it is in host
// memory, else the options' (finite by construction); a value on a CUDA device is not read (that
// would synchronise the host), and 0 stands for it.
double host_l1_gradient(const TrainingBackwardArgs& args, double option) {
  if (!args.l1_coef.defined()) return option;
  if (args.l1_coef.device.type != DeviceType::cpu) return 0.0;
  return double(*static_cast<const float*>(args.l1_coef.data));
}

// Dense autograd's gradient of g * l1_value w.r.t. h is g * sign(h) / M, and for a NaN or infinite
// g that is NaN where h = 0. In a gated FFN du = dh * relu(gate) carries that NaN into every
// element of dup and of dx (relu's own backward masks the inactive units, so dgate, ddown and a
// plain FFN's gradients follow from the active units alone, as the sparse paths compute them).
// The sparse paths skip the inactive units: this gives dup and dx dense's NaN (for an infinite g,
// also where dense's sum has active terms only and comes out as an infinity).
void propagate_nonfinite_l1(const TrainingBackwardArgs& args, FfnKind kind, double g) {
  if (std::isfinite(g) || kind != FfnKind::gated || args.dx.shape[0] == 0) return;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const TensorView* t : {&args.dup, &args.dx})
    for (int64_t i = 0, n = t->numel(); i < n; ++i) store_float(t->data, t->dtype, i, nan);
}

}  // namespace

void TrainingPlan::backward(const TrainingBackwardArgs& args, const TensorView& x,
                            const TwellView& saved, Stream stream) {
  const char* op = "TrainingPlan::backward";
  const FfnWeights& w = impl_->weights;
  const Device dev = w.up.device;
  const int64_t k = w.hidden(), n = w.intermediate();
  detail::check_matrix(op, "x", x, -1, k, w.up.dtype, dev);
  const int64_t m = x.shape[0];
  impl_->check_saved(op, saved, m);
  detail::check_matrix(op, "dy", args.dy, m, k, w.up.dtype, dev);
  detail::check_matrix(op, "dx", args.dx, m, k, w.up.dtype, dev);
  if (w.kind == FfnKind::gated) detail::check_matrix(op, "dgate", args.dgate, n, k, DType::f32, dev);
  detail::check_matrix(op, "dup", args.dup, n, k, DType::f32, dev);
  detail::check_matrix(op, "ddown", args.ddown, n, k, DType::f32, dev);
  if (args.l1_coef.defined()) detail::check_vector(op, "l1_coef", args.l1_coef, 1, DType::f32, dev);
  impl_->check_workspace(op, args.workspace, m, saved, TrainingCall::backward);
  std::vector<detail::ByteRange> outputs = {detail::byte_range(op, "dx", args.dx)};
  if (w.kind == FfnKind::gated) outputs.push_back(detail::byte_range(op, "dgate", args.dgate));
  outputs.push_back(detail::byte_range(op, "dup", args.dup));
  outputs.push_back(detail::byte_range(op, "ddown", args.ddown));
  outputs.push_back(impl_->workspace_range(op, args.workspace, m, saved, TrainingCall::backward));
  std::vector<detail::ByteRange> inputs = {detail::byte_range(op, "dy", args.dy),
                                           detail::byte_range(op, "x", x),
                                           detail::byte_range(op, "l1_coef", args.l1_coef)};
  for (detail::ByteRange& r : detail::saved_byte_ranges(op, saved)) inputs.push_back(std::move(r));
  impl_->check_overlaps(op, std::move(outputs), std::move(inputs));
  impl_->backend->raise_reported_fault(op);
  impl_->backend->check_saved(saved, impl_->saved_header(saved), stream);
  detail::translate_allocation_failure(op, [&] { impl_->backend->backward(args, x, saved, stream); });
  propagate_nonfinite_l1(args, w.kind, host_l1_gradient(args, impl_->options.l1_coef));
}

void TrainingPlan::forward(const TrainingForwardArgs& args, SavedActivations& saved, Stream stream) {
  detail::check_matrix("TrainingPlan::forward", "x", args.x, -1, impl_->weights.hidden(),
                       impl_->weights.up.dtype, impl_->weights.up.device);
  const TwellShape s = saved_shape(args.x.shape[0]);
  SavedActivations::Impl& st = *saved.impl();
  st.bytes = s.bytes(saved_dtype());
  st.storage = detail::allocate_or_throw("TrainingPlan::forward", "saved", st.bytes,
                                         [&] { return impl_->backend->allocate(st.bytes); });
  if (!st.storage)
    throw Error("TrainingPlan::forward", "saved", "memory for " + std::to_string(st.bytes) + " bytes",
                "allocation failed");
  st.view = make_twell_view(st.storage.get(), s, saved_dtype(), impl_->weights.up.device);
  st.x = args.x;
  st.backend = impl_->backend;
  forward(args, st.view, stream);
}

void TrainingPlan::backward(const TrainingBackwardArgs& args, const SavedActivations& saved,
                            Stream stream) {
  const SavedActivations::Impl& st = *saved.impl();
  if (!st.storage) throw Error("TrainingPlan::backward", "saved", "activations saved by forward()", "none");
  backward(args, st.x, st.view, stream);
}

}  // namespace twell
