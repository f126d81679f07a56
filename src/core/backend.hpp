// The seam between the public plans (src/core) and the backends (src/cpu, src/cuda). A plan
// validates arguments, resolves options and then talks to one backend object through this.
#pragma once
#include <algorithm>
#include <cstddef>
#include <memory>

#include "core/checked.hpp"
#include "twell/ffn.hpp"
#include "twell/training.hpp"

namespace twell::detail {

class InferenceBackend {
 public:
  virtual ~InferenceBackend() = default;
  virtual size_t workspace_bytes(int64_t rows) const = 0;
  // Memory on the backend's device that the backend keeps for callers that pass no workspace.
  virtual void* own_workspace(size_t bytes, Stream stream) = 0;
  // Arguments are already validated; workspace holds at least workspace_bytes(M) bytes.
  virtual RunInfo run(const InferenceArgs& args, Stream stream, void* workspace) = 0;
  // Weights already checked against the plan's (check_rebind).
  virtual void set_weights(const FfnWeights& w) = 0;
};

// set_weights' check: `w` valid and of `old`'s kind, dtype, device and shapes (Error naming `op`).
void check_rebind(const char* op, const FfnWeights& old, const FfnWeights& w);

// Backend defaults for options left at 0 / negative; an Error names `op` (the plan being made).
InferenceOptions resolve_inference_options(const InferenceOptions& o, Device dev, const char* op);
TrainingOptions resolve_training_options(const TrainingOptions& o, Device dev);

std::unique_ptr<InferenceBackend> make_cpu_inference(const FfnWeights& w, const InferenceOptions& o);
// Throws Error when the build has no CUDA backend or the shape is outside what it supports.
std::unique_ptr<InferenceBackend> make_cuda_inference(const FfnWeights& w,
                                                      const InferenceOptions& o);

// A plan's Impl for validated weights: the weights, the options resolved for their device and
// that device's backend (InferencePlan's and TrainingPlan's constructors).
template <typename Impl, typename Options, typename Resolve, typename MakeCpu, typename MakeCuda>
std::unique_ptr<Impl> make_plan_impl(const FfnWeights& w, const Options& o, const char* op, Resolve resolve,
                                     MakeCpu make_cpu, MakeCuda make_cuda) {
  w.validate(op);
  auto impl = std::make_unique<Impl>();
  impl->weights = w;
  const Device dev = w.up.device;
  impl->options = resolve(o, dev);
  impl->backend = translate_allocation_failure(op, [&] {
    return dev.type == DeviceType::cpu ? make_cpu(w, impl->options) : make_cuda(w, impl->options);
  });
  return impl;
}

class TrainingBackend {
 public:
  virtual ~TrainingBackend() = default;
  virtual DType saved_dtype() const = 0;
  // Scratch for a forward, a backward or both (call) of `rows` rows whose saved state has this form.
  virtual size_t workspace_bytes(int64_t rows, SavedForm form, TrainingCall call) const = 0;
  // Whether saved_shape(rows) should be the dense form (the backend's dispatch decision; never
  // waits for the device), and whether the backend runs that form at all.
  virtual bool wants_dense_layout(int64_t rows) = 0;
  virtual bool supports_dense_layout() const = 0;
  // The compact form's capacity for saved_shape(rows): one of saved_capacities(options.capacity,
  // options.min_capacity) (capacity.hpp; never waits for the device).
  virtual int32_t compact_capacity(int64_t rows) = 0;
  // Scratch for a step of either form this backend runs (TrainingPlan::workspace_bytes(M)).
  size_t any_form_workspace_bytes(int64_t rows) const {
    const size_t compact = workspace_bytes(rows, SavedForm::compact, TrainingCall::both);
    return supports_dense_layout()
               ? std::max(compact, workspace_bytes(rows, SavedForm::dense, TrainingCall::both))
               : compact;
  }
  // Weights already checked to match the plan's in kind, shapes, dtype and device.
  virtual void set_weights(const FfnWeights& w) = 0;
  // Arguments are validated; `saved` has the plan's saved_shape(M) in either form (dense:
  // backup_capacity == M > 0); a defined args.workspace holds
  // at least workspace_bytes(M, that form, that call) bytes.
  virtual void forward(const TrainingForwardArgs& args, const TwellView& saved, Stream stream) = 0;
  virtual void backward(const TrainingBackwardArgs& args, const TensorView& x,
                        const TwellView& saved, Stream stream) = 0;
  // The saved state's trust boundary. seal_saved marks a buffer that forward just wrote (its
  // header, stream-ordered after forward); check_saved runs before backward reads one: the header
  // must be `expected` and every index in bounds. CPU: checked here, Error at once. CUDA: checked
  // on the device without a host synchronisation; a fault empties the buffer's index arrays (so no
  // kernel indexes out of bounds) and is raised by raise_reported_fault at the plan's next call.
  virtual void seal_saved(const TwellView& saved, const TwellHeader& header, Stream stream) = 0;
  virtual void check_saved(const TwellView& saved, const TwellHeader& expected, Stream stream) = 0;
  virtual void raise_reported_fault(const char* /*op*/) {}
  // Device memory for SavedActivations, freed by the deleter.
  virtual std::shared_ptr<void> allocate(size_t bytes) = 0;
  // Host value of *saved.num_routed (synchronises where it must).
  virtual int64_t routed_rows(const TwellView& saved) = 0;
};

std::unique_ptr<TrainingBackend> make_cpu_training(const FfnWeights& w, const TrainingOptions& o);
std::unique_ptr<TrainingBackend> make_cuda_training(const FfnWeights& w, const TrainingOptions& o);

}  // namespace twell::detail

namespace twell {
class SavedActivations::Impl {
 public:
  std::shared_ptr<void> storage;
  TwellView view;
  TensorView x;
  size_t bytes = 0;
  std::shared_ptr<detail::TrainingBackend> backend;  // for routed_rows()
};
}  // namespace twell
