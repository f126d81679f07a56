// CUDA training against the fp64 oracle: the sweep of kinds, dtypes, patterns, densities and shapes,
// and indices past 32 bits (the tolerance rule: cuda_training_step.hpp).
#include "common.hpp"

#ifdef TWELL_WITH_CUDA
#include "cuda_training_step.hpp"
#endif

namespace twell::test {
namespace {

#ifndef TWELL_WITH_CUDA

TEST(CudaTraining, Backend) { GTEST_SKIP() << "built without CUDA"; }

#else

class CudaTraining : public ::testing::TestWithParam<Case> {};

TEST_P(CudaTraining, MatchesOracle) {
  TWELL_REQUIRE_DEVICE();
  const Case& c = GetParam();
  const CaseProblem cp = case_problem(c);
  DeviceStep d(cp.spec, options_of(c), c.l1_from, kTensorL1);
  EXPECT_GT(cp.heavy_margin, 0) << "no neuron past the split threshold: " << d.p.spec.describe();
  const StepOutputs o = run_step(d);
  expect_matches_oracle(d, o, "step");
}

INSTANTIATE_TEST_SUITE_P(Sweep, CudaTraining, ::testing::ValuesIn(sweep_cases()), case_name);

// ---------------------------------------------------------------------------------------------
// Indices past 32 bits and large M: M = 262144 at the LLM shape ([M, N] 1.5e9 elements, the dense
// form's [M, 2N] planes 3e9), an [M, N] of 2.15e9 elements with dense and hot rows routed to the
// backup, and M = 70000 with heavy neurons; the compact form and the dense form of each. The oracle of a
// whole step at this size is out of reach, so dy is zero except on a sample of rows (those on either side of
// each 2^31 / 2^32 element and byte boundary among them) and l1_coef is 0: then the weight gradients are sums
// over the sampled rows alone, and the oracle of the sampled rows' step is the oracle of the whole step.
// Every other row of dx must be exactly zero, and no row of y unwritten; the statistics (over all rows) of
// the two forms must agree.

TEST(CudaLarge, TrainingIndicesPast32Bits) {
  TWELL_REQUIRE_DEVICE();
  if (small_only()) GTEST_SKIP() << "large shapes only without TWELL_SMALL";
  if (device_free_bytes() < (size_t(28) << 30)) GTEST_SKIP() << "needs 28 GiB of free device memory";
  const CaseShape cases[] = {
      {FfnKind::gated, DType::bf16, Pattern::uniform, 0.005, 262144, 2048, 5632},
      {FfnKind::plain, DType::f16, Pattern::edge_rows, 0.02, 32777, 64, 65536},
      // Three weight-gradient passes of WeightGradConfig::kChunkRows, the last one short, with
      // heavy neurons (their kernel spans all rows) and long rows routed.
      {FfnKind::gated, DType::bf16, Pattern::heavy_tailed, 0.02, 70000, 256, 1000},
  };
  uint64_t salt = 1900;
  for (const CaseShape& lc : cases) {
    const Case c = problem_case<Case>(lc);
    TrainingOptions o = options_of(c);
    o.l1_coef = 0;
    DeviceStep d(spec_of(c, ++salt), o, L1From::options, 0.0f);
    const std::vector<int64_t> rows = testing::boundary_rows(d.p, {lc.k, lc.n, 2 * lc.n}, 32);
    std::vector<bool> sampled(size_t(lc.m), false);
    for (int64_t r : rows) sampled[size_t(r)] = true;
    const size_t row_bytes = size_t(lc.k) * dtype_size(lc.dtype);
    for (int64_t r = 0; r < lc.m; ++r)
      if (!sampled[size_t(r)]) std::memset(d.dy_host.data() + size_t(r) * row_bytes, 0, row_bytes);
    d.dy.upload(d.dy_host);
    const ref::Weights w = ref::from_weights(d.p.weights());
    const ref::Matrix x = testing::rows_of(d.p.x_view(), rows);
    const ref::Matrix dy = testing::rows_of(TensorView::matrix(d.dy_host.data(), lc.dtype, lc.m, lc.k), rows);

    std::vector<std::vector<float> > stats;
    for (const Dispatch form : {Dispatch::force_sparse, Dispatch::force_dense}) {
      o.dispatch = form;
      d.plan = std::make_unique<TrainingPlan>(d.weights(), o);
      d.saved = DeviceBuffer(d.plan->saved_shape(lc.m).bytes(d.plan->saved_dtype()));
      d.view = d.new_view(d.saved);
      const std::string where = std::string(form == Dispatch::force_dense ? "dense form" : "compact form") +
                                ": " + d.p.spec.describe();
      SCOPED_TRACE(where);
      const StepOutputs out = run_step(d);
      EXPECT_EQ(count_nonfinite(out.y, lc.dtype), 0) << "y rows left unwritten or not finite";
      EXPECT_EQ(count_nonfinite(out.dx, lc.dtype), 0) << "dx rows left unwritten or not finite";
      int64_t nonzero_outside = 0;
      for (int64_t r = 0; r < lc.m; ++r) {
        if (sampled[size_t(r)]) continue;
        for (size_t b = 0; b < row_bytes; b += 2) {
          uint16_t v;
          std::memcpy(&v, out.dx.data() + size_t(r) * row_bytes + b, 2);
          nonzero_outside += (v & 0x7fff) != 0;
        }
      }
      EXPECT_EQ(nonzero_outside, 0) << "dx entries on rows whose dy is zero";
      const ref::Matrix y = testing::rows_of(
          TensorView::matrix(const_cast<uint8_t*>(out.y.data()), lc.dtype, lc.m, lc.k), rows);
      const ref::Matrix dx = testing::rows_of(
          TensorView::matrix(const_cast<uint8_t*>(out.dx.data()), lc.dtype, lc.m, lc.k), rows);
      expect_grads_match(w, x, dy, 0.0, lc.dtype, y, dx, out, where);
      EXPECT_GE(out.routed, 0);
      EXPECT_LE(out.routed, lc.m);
      if (form == Dispatch::force_dense) EXPECT_EQ(out.routed, lc.m);
      if (lc.pattern == Pattern::edge_rows && form == Dispatch::force_sparse) EXPECT_GT(out.routed, 0);
      stats.push_back(out.stats);
    }
    // L0 and L1 over all M rows, from the compact rows' counts and from the dense hidden pass: gate
    // values within fp32 rounding of zero may flip between the fused gate and cuBLASLt.
    const double active = double(stats[0][0]) * double(lc.m);
    EXPECT_NEAR(stats[0][0], stats[1][0], (2 + active / 10000) / double(lc.m)) << "L0 of the two forms";
    EXPECT_NEAR(stats[0][1], stats[1][1], 2e-3 * std::fabs(stats[1][1])) << "L1 of the two forms";
    if (lc.pattern == Pattern::uniform) EXPECT_NEAR(stats[0][0] / double(lc.n), lc.density, 0.1 * lc.density);
  }
}

#endif  // TWELL_WITH_CUDA

}  // namespace
}  // namespace twell::test
