// The training plan: validation and backend dispatch for forward (saving the hybrid layout) and
// backward.
#include <cmath>
#include <string>

#include "core/backend.hpp"
#include "core/check.hpp"
#include "twell/training.hpp"

namespace twell {

SavedActivations::SavedActivations() : impl_(std::make_unique<Impl>()) {}
SavedActivations::~SavedActivations() = default;
SavedActivations::SavedActivations(SavedActivations&&) noexcept = default;
SavedActivations& SavedActivations::operator=(SavedActivations&&) noexcept = default;
size_t SavedActivations::bytes() const { return impl_->state ? impl_->state->bytes() : 0; }
int64_t SavedActivations::routed_rows() const {
  return impl_->state ? impl_->state->routed_rows() : 0;
}

namespace detail {

TrainingOptions resolve_training_options(const TrainingOptions& o, Device dev) {
  InferenceOptions io;
  io.tile = o.tile;
  io.capacity = o.capacity;
  io = resolve_inference_options(io, dev);
  TrainingOptions r = o;
  r.tile = io.tile;
  r.capacity = io.capacity;
  if (!(r.l1_coef >= 0.0) || !std::isfinite(r.l1_coef))
    throw Error("TrainingPlan", "options.l1_coef", "a finite value >= 0", std::to_string(r.l1_coef));
  return r;
}

}  // namespace detail

class TrainingPlan::Impl {
 public:
  FfnWeights weights;
  TrainingOptions options;
  std::unique_ptr<detail::TrainingBackend> backend;
};

TrainingPlan::TrainingPlan(const FfnWeights& weights, const TrainingOptions& options)
    : impl_(std::make_unique<Impl>()) {
  weights.validate("TrainingPlan");
  impl_->weights = weights;
  const Device dev = weights.up.device;
  impl_->options = detail::resolve_training_options(options, dev);
  impl_->backend = dev.type == DeviceType::cpu
                       ? detail::make_cpu_training(weights, impl_->options)
                       : detail::make_cuda_training(weights, impl_->options);
}

TrainingPlan::~TrainingPlan() = default;
TrainingPlan::TrainingPlan(TrainingPlan&&) noexcept = default;
TrainingPlan& TrainingPlan::operator=(TrainingPlan&&) noexcept = default;
const TrainingOptions& TrainingPlan::options() const { return impl_->options; }

void TrainingPlan::forward(const TrainingForwardArgs& args, SavedActivations& saved,
                           Stream stream) {
  const char* op = "TrainingPlan::forward";
  const FfnWeights& w = impl_->weights;
  const Device dev = w.up.device;
  detail::check_matrix(op, "x", args.x, -1, w.hidden(), w.up.dtype, dev);
  detail::check_matrix(op, "y", args.y, args.x.shape[0], w.hidden(), w.up.dtype, dev);
  if (args.stats.defined()) detail::check_vector(op, "stats", args.stats, 2, DType::f32, dev);
  saved.impl()->state = impl_->backend->forward(args, stream);
  saved.impl()->state->x = args.x;
}

void TrainingPlan::backward(const TrainingBackwardArgs& args, const SavedActivations& saved,
                            Stream stream) {
  const char* op = "TrainingPlan::backward";
  const FfnWeights& w = impl_->weights;
  const Device dev = w.up.device;
  const detail::SavedState* state = saved.impl()->state.get();
  if (state == nullptr) throw Error(op, "saved", "activations saved by forward()", "none");
  const int64_t m = state->x.shape[0], k = w.hidden(), n = w.intermediate();
  detail::check_matrix(op, "dy", args.dy, m, k, w.up.dtype, dev);
  detail::check_matrix(op, "dx", args.dx, m, k, w.up.dtype, dev);
  if (w.kind == FfnKind::gated) detail::check_matrix(op, "dgate", args.dgate, n, k, DType::f32, dev);
  detail::check_matrix(op, "dup", args.dup, n, k, DType::f32, dev);
  detail::check_matrix(op, "ddown", args.ddown, n, k, DType::f32, dev);
  impl_->backend->backward(args, *state, stream);
}

}  // namespace twell
