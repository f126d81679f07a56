// Public FFN types and the inference plan: validation, option resolution, backend dispatch.
#include <string>

#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/checked.hpp"
#include "core/policy.hpp"
#include "twell/ffn.hpp"
#include "twell/format.hpp"

namespace twell {

const char* ffn_kind_name(FfnKind k) { return k == FfnKind::gated ? "gated" : "plain"; }

double RunInfo::density() const {
  if (active < 0) return -1.0;
  return rows == 0 ? 0.0 : double(active) / double(rows);  // per token; divide by N for a fraction
}

void FfnWeights::validate(const char* op) const {
  if (!up.defined()) throw Error(op, "up weight", "a tensor [N, K]", "none");
  if (up.rank != 2) throw Error(op, "up weight", "rank 2 [N, K]", up.shape_string());
  if (!is_float_dtype(up.dtype))
    throw Error(op, "up weight", "float32, float16 or bfloat16", dtype_name(up.dtype));
  const int64_t n = up.shape[0], k = up.shape[1];
  if (n <= 0 || k <= 0) throw Error(op, "up weight", "non-empty [N, K]", up.shape_string());
  const std::string nk = "[N=" + std::to_string(n) + ", K=" + std::to_string(k) + "]";
  auto same = [&](const TensorView& t, const char* name) {
    if (!t.defined()) throw Error(op, name, "a tensor " + nk, "none");
    if (t.rank != 2 || t.shape[0] != n || t.shape[1] != k)
      throw Error(op, name, nk, t.shape_string());
    if (t.dtype != up.dtype) throw Error(op, name, dtype_name(up.dtype), dtype_name(t.dtype));
    if (t.device != up.device)
      throw Error(op, name, "device " + to_string(up.device), to_string(t.device));
    if (!t.is_contiguous()) throw Error(op, name, "a contiguous row-major tensor", "strided");
    detail::check_alignment(op, name, t.data, dtype_size(t.dtype));
  };
  same(up, "up weight");
  same(down, "down weight");
  if (kind == FfnKind::gated) {
    same(gate, "gate weight");
  } else if (gate.defined()) {
    throw Error(op, "gate weight", "none for a plain FFN", gate.shape_string());
  }
}

namespace detail {

InferenceOptions resolve_inference_options(const InferenceOptions& o, Device dev, const char* op) {
  InferenceOptions r = o;
  if (r.tile == 0) r.tile = policy::kDefaultTile;
  if (r.dense_above < 0)
    r.dense_above = dev.type == DeviceType::cpu ? policy::kCpuDenseAbove : policy::kCudaDenseAbove;
  if (r.capacity == 0) r.capacity = r.tile / policy::kDefaultCapacityDivisor;
  if (r.tile < 1 || r.tile > kMaxTwellTile)
    throw Error(op, "options.tile", "1.." + std::to_string(kMaxTwellTile), std::to_string(r.tile));
  // Counts are uint16: a (row, tile) holds at most kMaxTwellCapacity entries.
  if (r.capacity < 1 || r.capacity > r.tile || r.capacity > kMaxTwellCapacity)
    throw Error(op, "options.capacity",
                "1..min(tile (" + std::to_string(r.tile) + "), " + std::to_string(kMaxTwellCapacity) + ")",
                std::to_string(r.capacity));
  return r;
}

void check_rebind(const char* op, const FfnWeights& old, const FfnWeights& w) {
  w.validate(op);
  if (w.kind != old.kind) throw Error(op, "weights kind", ffn_kind_name(old.kind), ffn_kind_name(w.kind));
  if (w.up.dtype != old.up.dtype)
    throw Error(op, "weights dtype", dtype_name(old.up.dtype), dtype_name(w.up.dtype));
  if (w.up.device != old.up.device)
    throw Error(op, "weights device", to_string(old.up.device), to_string(w.up.device));
  if (w.hidden() != old.hidden() || w.intermediate() != old.intermediate())
    throw Error(op, "weights shape", old.up.shape_string(), w.up.shape_string());
}

}  // namespace detail

class InferencePlan::Impl {
 public:
  FfnWeights weights;
  InferenceOptions options;
  std::unique_ptr<detail::InferenceBackend> backend;
  RunInfo last;

  // The first problem with run()'s arguments, reported as `op`'s.
  std::optional<Error> args_error(const char* op, const InferenceArgs& a) const {
    const Device dev = weights.up.device;
    const int64_t k = weights.hidden();
    if (auto e = detail::matrix_error(op, "x", a.x, -1, k, weights.up.dtype, dev)) return e;
    if (auto e = detail::matrix_error(op, "y", a.y, a.x.shape[0], k, weights.up.dtype, dev)) return e;
    if (a.counters.defined())
      if (auto e = detail::vector_error(op, "counters", a.counters, 2, DType::i64, dev)) return e;
    return overlap_error(op, a, nullptr, 0);
  }

  // Outputs (y, counters, a caller workspace of `workspace_size` used bytes) must share no byte
  // with the inputs (x, the weights) or with each other.
  std::optional<Error> overlap_error(const char* op, const InferenceArgs& a, const void* workspace,
                                     size_t workspace_size) const {
    try {
      return detail::overlap_error(
          op,
          {detail::byte_range(op, "y", a.y), detail::byte_range(op, "counters", a.counters),
           detail::byte_range(op, "workspace", workspace, workspace_size, weights.up.device)},
          {detail::byte_range(op, "x", a.x), detail::byte_range(op, "gate weight", weights.gate),
           detail::byte_range(op, "up weight", weights.up),
           detail::byte_range(op, "down weight", weights.down)});
    } catch (const Error& e) {
      return e;
    }
  }
};

InferencePlan::InferencePlan(const FfnWeights& weights, const InferenceOptions& options)
    : impl_(detail::make_plan_impl<Impl>(
          weights, options, "InferencePlan",
          [](const InferenceOptions& o, Device dev) { return detail::resolve_inference_options(o, dev, "InferencePlan"); },
          detail::make_cpu_inference, detail::make_cuda_inference)) {}

InferencePlan::~InferencePlan() = default;
InferencePlan::InferencePlan(InferencePlan&&) noexcept = default;
InferencePlan& InferencePlan::operator=(InferencePlan&&) noexcept = default;

Status InferencePlan::can_run(const InferenceArgs& args) const {
  if (auto e = impl_->args_error("InferencePlan::run", args)) return Status::failure(e->what());
  return Status::success();
}

size_t InferencePlan::workspace_bytes(const InferenceArgs& args) const {
  if (auto e = impl_->args_error("InferencePlan::workspace_bytes", args)) throw *e;
  return impl_->backend->workspace_bytes(args.x.shape[0]);
}

size_t InferencePlan::workspace_bytes(int64_t rows) const {
  detail::check_workspace_rows("InferencePlan::workspace_bytes", rows);
  return impl_->backend->workspace_bytes(rows);
}

void InferencePlan::run(const InferenceArgs& args, Stream stream, void* workspace,
                        size_t workspace_size) {
  const char* op = "InferencePlan::run";
  if (auto e = impl_->args_error(op, args)) throw *e;
  const size_t need = impl_->backend->workspace_bytes(args.x.shape[0]);
  if (workspace == nullptr) {
    workspace = detail::translate_allocation_failure(op, [&] { return impl_->backend->own_workspace(need, stream); });
  } else if (workspace_size < need) {
    throw Error(op, "workspace", "at least " + std::to_string(need) + " bytes",
                std::to_string(workspace_size) + " bytes");
  } else if (auto e = detail::alignment_error(op, "workspace", workspace, detail::kWorkspaceAlign)) {
    throw *e;
  } else if (auto e = impl_->overlap_error(op, args, workspace, need)) {
    throw *e;
  }
  impl_->last = detail::translate_allocation_failure(op, [&] { return impl_->backend->run(args, stream, workspace); });
}

void InferencePlan::set_weights(const FfnWeights& w) {
  detail::check_rebind("InferencePlan::set_weights", impl_->weights, w);
  impl_->weights = w;
  impl_->backend->set_weights(w);
}

RunInfo InferencePlan::last_run() const { return impl_->last; }
const FfnWeights& InferencePlan::weights() const { return impl_->weights; }
const InferenceOptions& InferencePlan::options() const { return impl_->options; }

void ffn_forward(const FfnWeights& weights, const TensorView& x, const TensorView& y,
                 Stream stream, const InferenceOptions& options) {
  InferencePlan plan(weights, options);
  plan.run({x, y, {}}, stream);
}

}  // namespace twell
