// CPU runner: wall-clock (steady_clock) timings of the plan and of the gate sgemm alone. The
// weights (2048 x 5632 x 3 fp32 = 138 MB) exceed the caches, so repeated runs are not cache-warm.

#include <chrono>
#include <vector>

#include "cpu/blas.hpp"
#include "runner.hpp"
#include "twell/info.hpp"
#include "twell/twell.hpp"

namespace twell::testing {
namespace {

class CpuRunner final : public Runner {
 public:
  std::string device() const override { return "cpu: " + cpu_description(); }
  std::string backend() const override { return "cpu"; }

  void load(Problem& p) override {
    p_ = &p;
    w_ = p.weights();
    const auto& s = p.spec;
    y_.assign(size_t(s.m * s.k) * dtype_size(s.dtype), 0);
    plans_.clear();
    // The gate GEMM alone on fp32 operands, as the plan's BLAS call sees them.
    const TensorView& first = s.kind == FfnKind::gated ? w_.gate : w_.up;
    xf_.resize(size_t(s.m * s.k));
    wf_.resize(size_t(s.n * s.k));
    gf_.resize(size_t(s.m * s.n));
    for (int64_t i = 0; i < s.m * s.k; ++i) xf_[size_t(i)] = load_float(p.x.data(), s.dtype, i);
    for (int64_t i = 0; i < s.n * s.k; ++i) wf_[size_t(i)] = load_float(first.data, s.dtype, i);
  }

  void warm(Job j) override { job(j); }

  double time_once(Job j) override {
    const auto t0 = std::chrono::steady_clock::now();
    job(j);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  RunInfo run_once(Dispatch d, std::vector<uint8_t>& y_host) override {
    InferencePlan& plan = plan_for(d);
    plan.run(args());
    y_host = y_;
    return plan.last_run();
  }

  RunInfo last_run(Dispatch d) override { return plan_for(d).last_run(); }

 private:
  InferenceArgs args() {
    const auto& s = p_->spec;
    return {p_->x_view(), TensorView::matrix(y_.data(), s.dtype, s.m, s.k), {}};
  }

  void job(Job j) {
    const auto& s = p_->spec;
    if (j == Job::gate) {  // the CPU backend's own gate GEMM call
      cpu::gemm_nt(s.m, s.n, s.k, xf_.data(), wf_.data(), gf_.data());
      return;
    }
    plan_for(j == Job::dense ? Dispatch::force_dense : twell_dispatch_).run(args());
  }

  Problem* p_ = nullptr;
  std::vector<uint8_t> y_;
  std::vector<float> xf_, wf_, gf_;
};

}  // namespace

std::unique_ptr<Runner> make_cpu_runner() { return std::make_unique<CpuRunner>(); }

}  // namespace twell::testing
