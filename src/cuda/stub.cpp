// Built only when the CUDA backend is not: CUDA tensors get a clear error instead of a link error.
#include "core/backend.hpp"

namespace twell::detail {

std::unique_ptr<InferenceBackend> make_cuda_inference(const FfnWeights&, const InferenceOptions&) {
  throw Error("InferencePlan", "weights device", "cpu (this build has no CUDA backend)", "cuda");
}

std::unique_ptr<TrainingBackend> make_cuda_training(const FfnWeights&, const TrainingOptions&) {
  throw Error("TrainingPlan", "weights device", "cpu (this build has no CUDA backend)", "cuda");
}

}  // namespace twell::detail
