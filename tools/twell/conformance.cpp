#include "conformance.hpp"

#include <cstdio>
#include <ostream>

#include "check.hpp"  // testing/check.hpp: the oracle comparison
#include "harness.hpp"
#include "twell/info.hpp"
#include "workload.hpp"

namespace twell::cli {

int run_check(const std::string& backend, std::ostream& out) {
  const bool cuda = backend == "cuda" || (backend == "auto" && cuda_device_count() > 0);
  auto runner = cuda ? testing::make_cuda_runner() : testing::make_cpu_runner();
  out << "twell check on " << runner->device() << "\n";
  int failures = 0, index = 0;
  const DType dtypes[] = {DType::bf16, DType::f16, DType::f32};
  for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
    for (DType dt : dtypes) {
      if (cuda && dt == DType::f32) continue;  // the CUDA backend computes in 16-bit types
      for (testing::Pattern pat : {testing::Pattern::uniform, testing::Pattern::heavy_tailed,
                                   testing::Pattern::trained_like, testing::Pattern::edge_rows,
                                   testing::Pattern::all_zero, testing::Pattern::all_dense})
        for (Dispatch d : {Dispatch::force_sparse, Dispatch::automatic}) {
          testing::ProblemSpec s;
          s.kind = kind, s.dtype = dt, s.pattern = pat, s.density = 0.02;
          s.m = 257, s.k = 256, s.n = 1000 + 8 * (index % 3);
          s.seed = testing::session_seed() + uint64_t(index++);
          testing::Problem p = testing::make_problem(s);
          runner->load(p);
          std::vector<uint8_t> y;
          const RunInfo info = runner->run_once(d, y);
          const testing::ForwardCheck c = testing::check_forward(p, y.data());
          failures += !c.ok();
          char line[300];
          std::snprintf(line, sizeof line, "%-4s %-60s %-6s error %.2e (tol %.2e) routed %lld\n",
                        c.ok() ? "ok" : "FAIL", s.describe().c_str(),
                        d == Dispatch::automatic ? "auto" : "sparse", c.error, c.tolerance,
                        (long long)info.routed_rows);
          out << line;
        }
    }
  out << (failures ? "FAILED: " : "all passed: ") << failures << " failing case(s) of " << index << "\n";
  return failures;
}

}  // namespace twell::cli
