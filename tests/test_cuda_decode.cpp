// The decode path (the sparse path of M <= DecodeConfig::kMaxRows) against the fp64 oracle: M from
// 1 to 17 (a sample), around the fused kernel's limit of 32 and the decode limit and past it (where
// the TwELL path takes over), every activation pattern, both kinds and 16-bit dtypes, K and N
// that are not multiples of the column slice or the neuron chunk; the LLM shape at 0.5%;
// bit-identical reruns (entries split over several CTAs per column slice); counters; up to M = 32
// both the fused kernel and the two-kernel path (GateKernel::portable), and the fused kernel's N
// and K limits. Graph capture: CudaGraph (test_cuda_inference_api.cpp).
#include "common.hpp"

#ifdef TWELL_WITH_CUDA
#include <cuda_runtime.h>

#include <string>

#include "cuda/policy/config.hpp"
#include "cuda_util.hpp"
#endif

namespace twell::test {
namespace {

#ifndef TWELL_WITH_CUDA

TEST(CudaDecode, Backend) { GTEST_SKIP() << "built without CUDA"; }

#else

struct DecodeCase {
  FfnKind kind;
  DType dtype;
  Pattern pattern;
  double density;
  int64_t m, k, n;
};

std::string decode_name(const ::testing::TestParamInfo<DecodeCase>& info) {
  const DecodeCase& c = info.param;
  return std::string(ffn_kind_name(c.kind)) + "_" + dtype_name(c.dtype) + "_" + testing::pattern_name(c.pattern) +
         "_" + std::to_string(int(c.density * 1000 + 0.5)) + "pm_M" + std::to_string(c.m) + "_K" +
         std::to_string(c.k) + "_N" + std::to_string(c.n);
}

class CudaDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(CudaDecode, MatchesOracle) {
  TWELL_REQUIRE_DEVICE();
  const DecodeCase& c = GetParam();
  DeviceProblem d({c.kind, c.m, c.k, c.n, c.dtype, c.pattern, c.density, 256, seed(uint64_t(c.m * 31 + c.n))});
  InferenceOptions o;
  o.dispatch = Dispatch::force_sparse;
  InferencePlan plan(d.weights(), o);
  const Outcome first = run_once(plan, d);
  expect_matches_oracle(d, first.y, "decode");
  EXPECT_FALSE(first.info.ran_dense);
  if (c.m <= gpu::DecodeConfig::kMaxRows) EXPECT_EQ(first.counters[0], 0) << "the decode path routes no row";
  EXPECT_GE(first.counters[1], 0);
  if (c.pattern == Pattern::all_zero) EXPECT_EQ(first.counters[1], 0);
  // Bit-identical reruns on the decode path (past it, Determinism::fast lets the backup rows'
  // rounding change once the plan learned how many go through cuBLAS).
  if (c.m <= gpu::DecodeConfig::kMaxRows) {
    const Outcome again = run_once(plan, d);
    EXPECT_EQ(first.y, again.y) << "a rerun differs: " << d.p.spec.describe();
  }
  // Up to FusedDecodeConfig::kMaxRows the automatic gate runs the fused kernel; the portable gate
  // keeps the two-kernel decode path, which must agree with the oracle too.
  if (c.m <= gpu::FusedDecodeConfig::kMaxRows) {
    o.gate = GateKernel::portable;
    InferencePlan portable(d.weights(), o);
    const Outcome two_kernel = run_once(portable, d);
    expect_matches_oracle(d, two_kernel.y, "two-kernel decode");
  }
}

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> out;
  const int64_t ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 32, 33, 63, 64, 65, 128, 257};
  for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
    for (DType dt : {DType::bf16, DType::f16})
      for (Pattern p : {Pattern::uniform, Pattern::heavy_tailed, Pattern::trained_like, Pattern::edge_rows})
        for (int64_t m : ms) out.push_back({kind, dt, p, 0.05, m, 264, 1000});
  for (Pattern p : {Pattern::all_zero, Pattern::all_dense})
    for (int64_t m : {int64_t(1), int64_t(6), int64_t(64)}) out.push_back({FfnKind::gated, DType::bf16, p, 0.05, m, 264, 1000});
  // The paper's FFN shape at 0.5%, and K past one register slice of the TwELL row kernels.
  for (Pattern p : {Pattern::uniform, Pattern::heavy_tailed})
    for (int64_t m : {int64_t(1), int64_t(16), int64_t(64)}) out.push_back({FfnKind::gated, DType::bf16, p, 0.005, m, 2048, 5632});
  out.push_back({FfnKind::gated, DType::bf16, Pattern::uniform, 0.01, 3, 4096, 1048});
  out.push_back({FfnKind::plain, DType::f16, Pattern::heavy_tailed, 0.01, 5, 8192, 520});
  out.push_back({FfnKind::gated, DType::f16, Pattern::uniform, 0.01, 16, 4096, 1048});
  out.push_back({FfnKind::gated, DType::bf16, Pattern::heavy_tailed, 0.01, 12, 8192, 520});
  // The fused decode kernel's limits: N at its list capacity and one vector past it; K at x's
  // shared memory (8 parts of 1024 columns for one token tile, 4 for two, 2 for four) and one
  // vector past; K at the backend's largest.
  out.push_back({FfnKind::gated, DType::bf16, Pattern::uniform, 0.01, 2, 264, 32768});
  out.push_back({FfnKind::plain, DType::bf16, Pattern::edge_rows, 0.01, 1, 264, 32776});
  out.push_back({FfnKind::gated, DType::bf16, Pattern::heavy_tailed, 0.01, 8, 8192, 1000});
  out.push_back({FfnKind::plain, DType::f16, Pattern::uniform, 0.01, 7, 8200, 1000});
  out.push_back({FfnKind::gated, DType::f16, Pattern::edge_rows, 0.01, 16, 4096, 2056});
  out.push_back({FfnKind::gated, DType::bf16, Pattern::uniform, 0.01, 9, 4104, 1000});
  out.push_back({FfnKind::gated, DType::bf16, Pattern::edge_rows, 0.01, 32, 2048, 1000});
  out.push_back({FfnKind::plain, DType::f16, Pattern::heavy_tailed, 0.01, 24, 2056, 1000});
  out.push_back({FfnKind::gated, DType::f16, Pattern::heavy_tailed, 0.01, 4, 16384, 520});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Sweep, CudaDecode, ::testing::ValuesIn(decode_cases()), decode_name);

#endif

}  // namespace
}  // namespace twell::test
