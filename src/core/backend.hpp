// The seam between the public plans (src/core) and the backends (src/cpu, src/cuda). A plan
// validates arguments, resolves options and then talks to one backend object through this.
#pragma once
#include <cstddef>
#include <memory>

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
};

// Backend defaults for options left at 0 / negative.
InferenceOptions resolve_inference_options(const InferenceOptions& o, Device dev);
TrainingOptions resolve_training_options(const TrainingOptions& o, Device dev);

std::unique_ptr<InferenceBackend> make_cpu_inference(const FfnWeights& w, const InferenceOptions& o);
// Throws Error when the build has no CUDA backend or the shape is outside what it supports.
std::unique_ptr<InferenceBackend> make_cuda_inference(const FfnWeights& w,
                                                      const InferenceOptions& o);

// What forward keeps for backward; each backend derives its own.
class SavedState {
 public:
  virtual ~SavedState() = default;
  virtual size_t bytes() const = 0;
  virtual int64_t routed_rows() const = 0;
  TensorView x;
};

class TrainingBackend {
 public:
  virtual ~TrainingBackend() = default;
  virtual std::unique_ptr<SavedState> forward(const TrainingForwardArgs& args, Stream stream) = 0;
  virtual void backward(const TrainingBackwardArgs& args, const SavedState& saved,
                        Stream stream) = 0;
};

std::unique_ptr<TrainingBackend> make_cpu_training(const FfnWeights& w, const TrainingOptions& o);
std::unique_ptr<TrainingBackend> make_cuda_training(const FfnWeights& w, const TrainingOptions& o);

}  // namespace twell::detail

namespace twell {
class SavedActivations::Impl {
 public:
  std::unique_ptr<detail::SavedState> state;
};
}  // namespace twell
