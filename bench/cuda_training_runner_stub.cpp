// Built without the CUDA backend: asking for a CUDA runner is an error, not a link failure.
#include "training.hpp"
#include "twell/error.hpp"

namespace twell::bench {

std::unique_ptr<TrainingRunner> make_cuda_training_runner() {
  throw Error("make_cuda_training_runner", "backend", "cpu (this build has no CUDA backend)", "cuda");
}

}  // namespace twell::bench
