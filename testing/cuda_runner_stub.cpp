// Built without the CUDA backend: asking for a CUDA runner is an error, not a link failure.
#include "runner.hpp"
#include "twell/error.hpp"

namespace twell::testing {

std::unique_ptr<Runner> make_cuda_runner() {
  throw Error("make_cuda_runner", "backend", "cpu (this build has no CUDA backend)", "cuda");
}

}  // namespace twell::testing
