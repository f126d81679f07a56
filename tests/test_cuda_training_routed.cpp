// CUDA training: determinism, the routed rows' cuBLAS share and their chunks, against the fp64
// oracle (cuda_training_step.hpp).
#include "common.hpp"

#ifdef TWELL_WITH_CUDA
#include "cuda_training_step.hpp"
#include "cuda/training/workspace.hpp"
#endif

namespace twell::test {
namespace {

#ifdef TWELL_WITH_CUDA

// ---------------------------------------------------------------------------------------------
// Determinism: a second forward (its routed rows listed in another atomic order) and backward on a
// fresh saved buffer give bit-identical outputs, and so does a second backward on the same one.

struct DeterminismCase {
  FfnKind kind;
  DType dtype;
};

// Edge rows at tile 64, capacity 4: some rows overflow a tile and are routed, the rest stay compact.
Case routed_mix_case(const DeterminismCase& p, double density, int64_t k) {
  return problem_case<Case>(p.kind, p.dtype, Pattern::edge_rows, density, 257, k, 1000, 64, 4);
}

class CudaTrainingDeterminism : public ::testing::TestWithParam<DeterminismCase> {
 protected:
  void check_reruns_bit_identical(int64_t k) {
    SCOPED_TRACE("K = " + std::to_string(k));
    const Case c = routed_mix_case(GetParam(), 0.05, k);
    TrainingOptions o = options_of(c);
    o.determinism = Determinism::deterministic;
    DeviceStep d(spec_of(c, 1202), o, L1From::options, 0.0f);
    const StepOutputs first = run_step(d);
    expect_matches_oracle(d, first, "first step");
    EXPECT_GT(first.routed, 0) << "the case should route some rows";
    EXPECT_LT(first.routed, c.m) << "the case should keep some rows compact";

    DeviceBuffer other(d.saved.bytes());
    const TwellView second_view = d.new_view(other);
    d.poison_outputs();
    d.enqueue(second_view, nullptr);
    cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "second step");
    const StepOutputs second = download(d, second_view);
    EXPECT_EQ(first.y, second.y);
    EXPECT_EQ(first.dx, second.dx);
    EXPECT_EQ(first.dgate, second.dgate);
    EXPECT_EQ(first.dup, second.dup);
    EXPECT_EQ(first.ddown, second.ddown);
    EXPECT_EQ(first.stats, second.stats);
    EXPECT_EQ(first.routed, second.routed);

    for (DeviceBuffer* b : {&d.dx, &d.dgate, &d.dup, &d.ddown}) b->poison();
    d.plan->backward(d.backward_args(), d.x_view(), second_view, nullptr);
    cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "third backward");
    const StepOutputs third = download(d, second_view);
    EXPECT_EQ(first.dx, third.dx);
    EXPECT_EQ(first.dgate, third.dgate);
    EXPECT_EQ(first.dup, third.dup);
    EXPECT_EQ(first.ddown, third.ddown);
  }
};

TEST_P(CudaTrainingDeterminism, RerunsAreBitIdentical) {
  TWELL_REQUIRE_DEVICE();
  for (const int64_t k : {136, 512})  // the CTA-per-row kernels, the warp-per-row ones
    check_reruns_bit_identical(k);
}

// Determinism::fast: the routed rows' dense products go through cuBLAS for as many rows as the
// plan learned from its earlier forwards. The first step (nothing learned: the tensor-core
// kernels), a second on the same data (cuBLAS takes every routed row), then data whose routed
// rows outnumber what was learned (both, split at C).
class CudaTrainingRoutedBlas : public ::testing::TestWithParam<DeterminismCase> {};

TEST_P(CudaTrainingRoutedBlas, LearnedCublasShareMatchesOracle) {
  TWELL_REQUIRE_DEVICE();
  for (const int64_t k : {136, 512}) {  // the CTA-per-row kernels, the warp-per-row ones
    const Case c = routed_mix_case(GetParam(), 0.01, k);  // force_sparse, Case's default
    TrainingOptions o = options_of(c);
    o.determinism = Determinism::fast;
    DeviceStep d(spec_of(c, 1250), o, L1From::options, 0.0f);
    const StepOutputs first = run_step(d);
    expect_matches_oracle(d, first, "first step");
    EXPECT_GT(first.routed, 0) << "the case should route some rows";
    EXPECT_LT(first.routed, c.m / 2) << "the case should keep most rows compact";
    const StepOutputs second = run_step(d);
    expect_matches_oracle(d, second, "second step (cuBLAS)");
    EXPECT_EQ(second.routed, first.routed);

    Case dense = c;
    dense.pattern = Pattern::all_dense;
    load_problem(d, testing::make_problem(spec_of(dense, 1251)));
    const StepOutputs third = run_step(d);
    expect_matches_oracle(d, third, "every row routed (cuBLAS, then the kernels)");
    EXPECT_EQ(third.routed, c.m);
  }
}

// Backward's routed rows in chunks (RoutedChunkConfig: their dense rows for all M rows take more
// than kMinBytes; at tile 64, capacity 4 six chunks gated, four plain), in a caller workspace of
// exactly workspace_bytes(M, compact, call) for each call, poisoned before every step. Uniform 2.5% routes about 60% of the rows: the first chunks full, a later one part-full,
// all on the kernels; the same data again with cuBLAS taking the learned share (capped at the
// chunk: the first chunk all cuBLAS); every row routed (every chunk full); a few rows routed (the
// last chunk empty). Deterministic: the first step, and a rerun
// bit-identical to it. Not under TWELL_SMALL; scripts/gpu-check runs the gated case under memcheck.
class CudaTrainingRoutedChunks : public ::testing::TestWithParam<DeterminismCase> {};

TEST_P(CudaTrainingRoutedChunks, MatchOracle) {
  TWELL_REQUIRE_DEVICE();
  if (small_only()) GTEST_SKIP() << "large shapes only without TWELL_SMALL";
  const DeterminismCase& k = GetParam();
  const bool gated = k.kind == FfnKind::gated;
  const int64_t m = 2304, n = gated ? 2560 : 4096;
  ASSERT_GT(size_t(m * n) * dtype_size(k.dtype) * (gated ? 3 : 2), twell::gpu::RoutedChunkConfig::kMinBytes);
  const twell::gpu::ProblemDims dims{k.kind, k.dtype, 64, n, 64, 4};
  const int64_t chunk = twell::gpu::routed_chunk_rows(dims, m);
  EXPECT_EQ(chunk, gated ? 384 : 576);  // M / 6 and M / 4, whole 64-row multiples
  for (const Determinism det : {Determinism::fast, Determinism::deterministic}) {
    SCOPED_TRACE(det == Determinism::fast ? "fast" : "deterministic");
    const Case c = problem_case<Case>(k.kind, k.dtype, Pattern::uniform, gated ? 0.025 : 0.022, m, 64, n, 64, 4);
    TrainingOptions o = options_of(c);
    o.determinism = det;
    DeviceStep d(spec_of(c, 1270), o, L1From::options, 0.0f);
    d.workspace = DeviceBuffer(d.plan->workspace_bytes(m, SavedForm::compact, TrainingCall::forward));
    d.backward_workspace = DeviceBuffer(d.plan->workspace_bytes(m, SavedForm::compact, TrainingCall::backward));
    EXPECT_EQ(d.plan->workspace_bytes(m, SavedForm::compact),
              std::max(d.workspace.bytes(), d.backward_workspace.bytes()));
    const StepOutputs first = run_step(d);
    expect_matches_oracle(d, first, "routed rows past the first chunk");
    EXPECT_GT(first.routed, chunk) << "the case should route rows into the second chunk";
    EXPECT_LT(first.routed, m) << "the case should keep some rows compact";
    const StepOutputs second = run_step(d);
    EXPECT_EQ(second.routed, first.routed);
    if (det == Determinism::deterministic) {  // the rest as in fast, minus cuBLAS: the same kernels
      EXPECT_EQ(first.y, second.y);
      EXPECT_EQ(first.dx, second.dx);
      EXPECT_EQ(first.dgate, second.dgate);
      EXPECT_EQ(first.dup, second.dup);
      EXPECT_EQ(first.ddown, second.ddown);
      continue;
    }
    expect_matches_oracle(d, second, "the first chunk through cuBLAS");

    Case dense = c;
    dense.pattern = Pattern::all_dense;
    load_problem(d, testing::make_problem(spec_of(dense, 1271)));
    const StepOutputs all = run_step(d);
    expect_matches_oracle(d, all, "every row routed");
    EXPECT_EQ(all.routed, m);

    Case few = c;
    few.pattern = Pattern::edge_rows;
    few.density = 0.01;
    load_problem(d, testing::make_problem(spec_of(few, 1272)));
    const StepOutputs some = run_step(d);
    expect_matches_oracle(d, some, "a few rows routed");
    EXPECT_GT(some.routed, 0);
    EXPECT_LT(some.routed, m - chunk);  // the last chunk empty
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, CudaTrainingRoutedChunks,
                         ::testing::Values(DeterminismCase{FfnKind::gated, DType::bf16},
                                           DeterminismCase{FfnKind::plain, DType::f16}),
                         [](const ::testing::TestParamInfo<DeterminismCase>& i) {
                           return std::string(ffn_kind_name(i.param.kind)) + "_" + dtype_name(i.param.dtype);
                         });

INSTANTIATE_TEST_SUITE_P(Kinds, CudaTrainingRoutedBlas,
                         ::testing::Values(DeterminismCase{FfnKind::gated, DType::bf16},
                                           DeterminismCase{FfnKind::plain, DType::f16}),
                         [](const ::testing::TestParamInfo<DeterminismCase>& i) {
                           return std::string(ffn_kind_name(i.param.kind)) + "_" + dtype_name(i.param.dtype);
                         });

INSTANTIATE_TEST_SUITE_P(Kinds, CudaTrainingDeterminism,
                         ::testing::Values(DeterminismCase{FfnKind::gated, DType::bf16},
                                           DeterminismCase{FfnKind::plain, DType::f16}),
                         [](const ::testing::TestParamInfo<DeterminismCase>& i) {
                           return std::string(ffn_kind_name(i.param.kind)) + "_" + dtype_name(i.param.dtype);
                         });

#endif  // TWELL_WITH_CUDA

}  // namespace
}  // namespace twell::test
