// CUDA training is a later step: a CUDA training plan reports that clearly instead of failing
// to link or silently running elsewhere.
#include "core/backend.hpp"

namespace twell::detail {

std::unique_ptr<TrainingBackend> make_cuda_training(const FfnWeights&, const TrainingOptions&) {
  throw Error("TrainingPlan", "weights device", "cpu (CUDA training is not implemented yet)", "cuda");
}

}  // namespace twell::detail
