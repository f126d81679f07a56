// The CUDA inference backend against the fp64 oracle: every activation pattern, odd M, small and
// LLM-sized shapes, both FFN kinds and 16-bit dtypes, each dispatch mode; the backup rows' cuBLAS
// share; counters. The pack kernel, graphs and the API: test_cuda_inference_api.cpp.
// TWELL_SMALL=1 keeps only small shapes (for the compute-sanitizer runs of scripts/gpu-check).
#include "common.hpp"

#ifdef TWELL_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/kernels/inference.hpp"
#include "cuda/policy/calibration.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/device.hpp"
#include "cuda_util.hpp"
#endif

namespace twell::test {
namespace {

#ifndef TWELL_WITH_CUDA

TEST(CudaInference, Backend) { GTEST_SKIP() << "built without CUDA"; }

#else

// ---------------------------------------------------------------------------------------------
// Forward sweep against the oracle.

struct Case {
  FfnKind kind = FfnKind::gated;
  DType dtype = DType::bf16;
  Pattern pattern = Pattern::uniform;
  double density = 0.05;
  int64_t m = 1, k = 64, n = 520;
  Dispatch dispatch = Dispatch::force_sparse;
  int32_t tile = 0, capacity = 0;
  GateKernel gate = GateKernel::automatic;  // fused on sm_90a devices
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string density = std::to_string(int(c.density * 1000 + 0.5));  // per mille
  std::string s = std::string(ffn_kind_name(c.kind)) + "_" + dtype_name(c.dtype) + "_" +
                  testing::pattern_name(c.pattern) + "_" + density + "pm_M" + std::to_string(c.m) +
                  "_K" + std::to_string(c.k) + "_N" + std::to_string(c.n) + "_" +
                  dispatch_name(c.dispatch);
  if (c.tile != 0) s += "_tile" + std::to_string(c.tile) + "_cap" + std::to_string(c.capacity);
  if (c.gate == GateKernel::portable) s += "_portable";
  return s;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << ffn_kind_name(c.kind) << " " << dtype_name(c.dtype) << " " << testing::pattern_name(c.pattern)
      << " " << c.density << " M=" << c.m << " K=" << c.k << " N=" << c.n << " "
      << dispatch_name(c.dispatch) << " tile=" << c.tile << " capacity=" << c.capacity
      << (c.gate == GateKernel::portable ? " portable gate" : "");
}

struct PatternDensity {
  Pattern pattern;
  double density;
};

const PatternDensity kAllPatterns[] = {
    {Pattern::uniform, 0.005},      {Pattern::uniform, 0.05},   {Pattern::uniform, 0.3},
    {Pattern::heavy_tailed, 0.02},  {Pattern::edge_rows, 0.05}, {Pattern::all_zero, 0.0},
    {Pattern::all_dense, 1.0},
};

std::vector<Case> sparse_cases() {
  std::vector<Case> out;
  const bool small = small_only();
  struct Shape { int64_t m, k, n; };
  // {65, 2048, 264}: a row spans two warps, so the cross-warp dot reduction runs.
  std::vector<Shape> shapes = {{1, 64, 520},    {7, 64, 520},     {255, 64, 520}, {257, 64, 520},
                               {7, 136, 1000},  {257, 136, 1000}, {65, 2048, 264}};
  if (!small) shapes.push_back({4097, 64, 520});
  for (DType dt : {DType::bf16, DType::f16})
    for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
      for (const PatternDensity& pd : kAllPatterns)
        for (const Shape& s : shapes) {
          out.push_back(problem_case<Case>(kind, dt, pd.pattern, pd.density, s.m, s.k, s.n));
        }
  // Non-default tiles and capacities (capacity 1 routes nearly everything; capacity = tile none).
  struct TileCap { int32_t tile, capacity; };
  for (DType dt : {DType::bf16, DType::f16})
    for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
      for (TileCap tc : {TileCap{64, 8}, TileCap{128, 1}, TileCap{256, 256}}) {
        out.push_back(problem_case<Case>(kind, dt, Pattern::edge_rows, 0.05,
            257, 136, 1000, tc.tile, tc.capacity));
      }
  // The row kernels in column ranges of K (row_ffn.cu): K over 2048 in 2, 3 (uneven) and 4
  // ranges, and a gated N too narrow for them (the compact kernel instead). Heavy-tailed rows are
  // long rows (the long-row passes) and routed rows (the backup).
  const Shape passes[] = {{65, 2560, 1000}, {33, 4352, 264}, {9, 2304, 136}, {17, 8192, 520}};
  for (DType dt : {DType::bf16, DType::f16})
    for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
      for (PatternDensity pd : {PatternDensity{Pattern::uniform, 0.005},
                                PatternDensity{Pattern::heavy_tailed, 0.02},
                                PatternDensity{Pattern::edge_rows, 0.05},
                                PatternDensity{Pattern::all_dense, 1.0}})
        for (const Shape& s : passes)
          out.push_back(problem_case<Case>(kind, dt, pd.pattern, pd.density, s.m, s.k, s.n));
  // Compact rows over the dense-row threshold (N / RowConfig::kDenseRowDivisor, at least
  // kLongRow = 96; ~205 entries at 10% of N = 2048, most within the capacity): written densely into
  // G and run by the tensor-core backup, from the long-row kernel (one range) and from the first
  // long-row pass (three ranges).
  for (DType dt : {DType::bf16, DType::f16})
    for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
      for (int64_t k : {int64_t(2048), int64_t(5120)})
        out.push_back(problem_case<Case>(kind, dt, Pattern::uniform, 0.1, 33, k, 2048));
  if (small) return out;
  // LLM-sized (hidden 2048, intermediate 5632): small M only, the oracle is slow there.
  struct Llm { FfnKind kind; DType dtype; Pattern pattern; double density; int64_t m; };
  const Llm llm[] = {
      {FfnKind::gated, DType::bf16, Pattern::uniform, 0.005, 7},
      {FfnKind::gated, DType::bf16, Pattern::heavy_tailed, 0.02, 7},
      {FfnKind::gated, DType::bf16, Pattern::edge_rows, 0.05, 7},
      {FfnKind::plain, DType::bf16, Pattern::heavy_tailed, 0.02, 7},
      {FfnKind::gated, DType::f16, Pattern::edge_rows, 0.05, 7},
      {FfnKind::gated, DType::bf16, Pattern::uniform, 0.005, 1},
      {FfnKind::plain, DType::f16, Pattern::uniform, 0.005, 1},
  };
  for (const Llm& l : llm) {
    out.push_back(problem_case<Case>(l.kind, l.dtype, l.pattern, l.density, l.m, 2048, 5632));
  }
  // 7B-class (4096 x 11008): 4 column ranges.
  Case big;
  big.density = 0.005;
  big.m = 3;
  big.k = 4096;
  big.n = 11008;
  out.push_back(big);
  out.push_back(problem_case<Case>(FfnKind::gated, DType::bf16, Pattern::heavy_tailed, 0.02,
      5, 4096, 11008));
  // The other model widths the inference issue names: 2560 x 6912, 5120 x 14336 and the 70B-class
  // 8192 x 28672 (4 column ranges of K, 112 tiles of N).
  const CaseShape wide[] = {
      {FfnKind::gated, DType::bf16, Pattern::uniform, 0.005, 5, 2560, 6912},
      {FfnKind::gated, DType::f16, Pattern::heavy_tailed, 0.02, 5, 5120, 14336},
      {FfnKind::gated, DType::bf16, Pattern::uniform, 0.005, 3, 8192, 28672},
      {FfnKind::plain, DType::bf16, Pattern::edge_rows, 0.05, 3, 8192, 28672},
  };
  for (const CaseShape& w : wide) out.push_back(problem_case<Case>(w));
  return out;
}

std::vector<Case> dispatch_cases() {
  std::vector<Case> out;
  const bool small = small_only();
  struct Shape { int64_t m, k, n; };
  std::vector<Shape> shapes = {{257, 136, 1000}};
  if (!small) shapes.push_back({4097, 64, 520});
  for (Dispatch dispatch : {Dispatch::force_dense, Dispatch::automatic})
    for (DType dt : {DType::bf16, DType::f16})
      for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
        for (PatternDensity pd : {PatternDensity{Pattern::uniform, 0.05},
                                  PatternDensity{Pattern::edge_rows, 0.05},
                                  PatternDensity{Pattern::all_zero, 0.0},
                                  PatternDensity{Pattern::all_dense, 1.0}})
          for (const Shape& s : shapes) {
            Case c = problem_case<Case>(kind, dt, pd.pattern, pd.density, s.m, s.k, s.n);
            c.dispatch = dispatch;
            out.push_back(c);
          }
  if (small) return out;
  for (Dispatch dispatch : {Dispatch::force_dense, Dispatch::automatic}) {
    Case c = problem_case<Case>(FfnKind::gated, DType::bf16, Pattern::uniform, 0.005,
        7, 2048, 5632);
    c.dispatch = dispatch;
    out.push_back(c);
  }
  return out;
}

InferenceOptions options_of(const Case& c) {
  InferenceOptions o;
  o.dispatch = c.dispatch;
  o.tile = c.tile;
  o.capacity = c.capacity;
  o.gate = c.gate;
  return o;
}

// The portable gate (cuBLASLt + pack kernel) where the fused sm_90a kernel would run by default:
// every pattern, tile and capacity at one odd shape, and the LLM shapes (the pack feeds the same
// row kernels, so the other column-range shapes are not repeated).
std::vector<Case> portable_cases() {
  std::vector<Case> out;
  for (Case c : sparse_cases())
    if (c.m == 257 || c.k == 2048 || (c.k == 4096 && c.pattern == Pattern::uniform)) {
      c.gate = GateKernel::portable;
      out.push_back(c);
    }
  return out;
}

class CudaForward : public ::testing::TestWithParam<Case> {};

TEST_P(CudaForward, MatchesOracle) {
  TWELL_REQUIRE_DEVICE();
  const Case& c = GetParam();
  DeviceProblem d(spec_of(c, 101));
  InferencePlan plan(d.weights(), options_of(c));
  const Outcome first = run_once(plan, d);
  expect_matches_oracle(d, first.y, "first run");
  EXPECT_EQ(first.info.rows, c.m);
  EXPECT_EQ(first.info.ran_dense, c.dispatch == Dispatch::force_dense);
  EXPECT_GE(first.counters[0], 0);
  EXPECT_LE(first.counters[0], c.m);
  if (c.pattern == Pattern::all_zero) {
    EXPECT_EQ(first.counters[0], 0);
    EXPECT_EQ(first.counters[1], 0);
  }
  if (c.pattern == Pattern::all_dense) {
    EXPECT_EQ(first.counters[1], c.m * c.n);
    const int32_t capacity = plan.options().capacity;
    // The decode path (M <= DecodeConfig::kMaxRows) routes nothing: it has no capacity.
    const bool routes = c.m > gpu::DecodeConfig::kMaxRows &&
                        capacity < std::min<int32_t>(plan.options().tile, int32_t(c.n));
    if (c.dispatch != Dispatch::force_dense) EXPECT_EQ(first.counters[0], routes ? c.m : 0);
  }
  if (c.dispatch != Dispatch::automatic) return;
  // The second run follows what the first one measured (it has completed by now): above the
  // plan's dense_above it runs dense; below it, a regime's second run is the trial of the dense
  // path. Every run is exact whichever path it takes.
  const Outcome second = run_once(plan, d);
  expect_matches_oracle(d, second.y, "second run");
  if (c.pattern == Pattern::all_dense || c.pattern == Pattern::all_zero)
    EXPECT_TRUE(second.info.ran_dense);
  const Outcome third = run_once(plan, d);
  expect_matches_oracle(d, third.y, "third run");
  if (c.pattern == Pattern::all_dense) EXPECT_TRUE(third.info.ran_dense);
}

INSTANTIATE_TEST_SUITE_P(Sparse, CudaForward, ::testing::ValuesIn(sparse_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Dispatch, CudaForward, ::testing::ValuesIn(dispatch_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Portable, CudaForward, ::testing::ValuesIn(portable_cases()), case_name);

// ---------------------------------------------------------------------------------------------
// Indices past 32 bits: [M, N] and [M, K] matrices of more than 2^31 bytes and elements, at the
// largest M the training issue names (262144). Every path (the fused or portable gate with the
// compact rows and the backup, and dense), each once per plan. The oracle runs on a sample of rows
// (forward rows are independent) that includes the rows on either side of each 2^31 / 2^32 element
// and byte boundary; every other row must be written (no NaN left from the poison).

const CaseShape kLargeCases[] = {
    // [M, N] of 1.5e9 elements (2.95 GB), [M, K] 1.07 GB: the LLM shape at M = 262144.
    {FfnKind::gated, DType::bf16, Pattern::uniform, 0.005, 262144, 2048, 5632},
    // [M, N] of 2.15e9 elements; edge rows: dense, hot-tile and empty rows among them (backup).
    {FfnKind::gated, DType::bf16, Pattern::edge_rows, 0.02, 32777, 64, 65536},
    // [M, K] of 2.15e9 elements (K = 16384, 4.3 GB each for x and y), K in column ranges.
    {FfnKind::plain, DType::f16, Pattern::heavy_tailed, 0.02, 131080, 16384, 264},
};

TEST(CudaLarge, InferenceIndicesPast32Bits) {
  TWELL_REQUIRE_DEVICE();
  if (small_only()) GTEST_SKIP() << "large shapes only without TWELL_SMALL";
  if (device_free_bytes() < (size_t(14) << 30)) GTEST_SKIP() << "needs 14 GiB of free device memory";
  const bool fused = gpu::gate_pack_available(gpu::query_device(0, "test"));
  uint64_t salt = 1400;
  for (const CaseShape& lc : kLargeCases) {
    const Case c = problem_case<Case>(lc);
    DeviceProblem d(spec_of(c, ++salt));
    const std::vector<int64_t> rows = testing::boundary_rows(d.p, {lc.k, lc.n, 2 * lc.n}, 48);
    std::vector<std::pair<std::string, InferenceOptions> > modes;
    InferenceOptions o;
    o.dispatch = Dispatch::force_sparse;
    modes.emplace_back(fused ? "sparse, fused gate" : "sparse", o);
    if (fused) {
      o.gate = GateKernel::portable;
      modes.emplace_back("sparse, portable gate", o);
    }
    o = InferenceOptions();
    o.dispatch = Dispatch::force_dense;
    modes.emplace_back("dense", o);
    for (const auto& [name, options] : modes) {
      SCOPED_TRACE(name);
      InferencePlan plan(d.weights(), options);
      const Outcome out = run_once(plan, d);
      EXPECT_EQ(count_nonfinite(out.y, lc.dtype), 0) << "rows left unwritten or not finite";
      expect_matches_oracle(d, out.y, name, &rows);
      EXPECT_GE(out.counters[0], 0);
      EXPECT_LE(out.counters[0], lc.m);
      if (options.dispatch == Dispatch::force_dense) EXPECT_TRUE(out.info.ran_dense);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The backup's rows through cuBLAS: a plan learns how many rows to send there from its earlier
// runs. The first run (nothing learned: the tensor-core kernel), a second on the same data (C
// covers every backup row: cuBLAS), then data whose backup rows outnumber C (both, split at C).

class CudaBackupRows : public ::testing::TestWithParam<Case> {};

TEST_P(CudaBackupRows, LearnedCublasShareMatchesOracle) {
  TWELL_REQUIRE_DEVICE();
  const Case& c = GetParam();
  DeviceProblem d(spec_of(c, 111));
  InferencePlan plan(d.weights(), options_of(c));
  const Outcome first = run_once(plan, d);
  expect_matches_oracle(d, first.y, "first run");
  EXPECT_GT(first.counters[0], 0) << "the case should route some rows";
  EXPECT_LT(first.counters[0], c.m / 2) << "the case should keep most rows compact";
  const Outcome second = run_once(plan, d);
  expect_matches_oracle(d, second.y, "second run (cuBLAS)");
  EXPECT_EQ(second.counters, first.counters);

  Case dense = c;
  dense.pattern = Pattern::all_dense;
  load_problem(d, testing::make_problem(spec_of(dense, 112)));
  const Outcome third = run_once(plan, d);
  expect_matches_oracle(d, third.y, "every row routed (cuBLAS, then the kernel)");
  EXPECT_EQ(third.counters[0], c.m);
}

// Determinism::deterministic: every backup row on the kernel in every run, so reruns (after
// which fast would have sent them through cuBLAS) are bit-identical.
TEST_P(CudaBackupRows, DeterministicRerunsAreBitIdentical) {
  TWELL_REQUIRE_DEVICE();
  const Case& c = GetParam();
  DeviceProblem d(spec_of(c, 113));
  InferenceOptions o = options_of(c);
  o.determinism = Determinism::deterministic;
  InferencePlan plan(d.weights(), o);
  const Outcome first = run_once(plan, d);
  expect_matches_oracle(d, first.y, "first run");
  EXPECT_GT(first.counters[0], 0) << "the case should route some rows";
  for (int run = 2; run <= 3; ++run) {
    const Outcome again = run_once(plan, d);
    EXPECT_EQ(again.y, first.y) << "run " << run;
    EXPECT_EQ(again.counters, first.counters) << "run " << run;
  }
}

std::vector<Case> backup_cases() {
  std::vector<Case> out;
  for (const int64_t k : {136, 2048, 2560}) {  // compact kernel, row kernel, column ranges
    for (const auto& [kind, dtype] : {std::pair{FfnKind::gated, DType::bf16}, std::pair{FfnKind::plain, DType::f16}}) {
      // few uniform rows overflow a tile; the dense edge rows do
      out.push_back(problem_case<Case>(kind, dtype, Pattern::edge_rows, 0.01, 257, k, 1000, 64, 4));
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Learned, CudaBackupRows, ::testing::ValuesIn(backup_cases()), case_name);

// ---------------------------------------------------------------------------------------------
// Counters: routed rows and active entries against the oracle's G (rounded to the dtype).

struct Expected {
  int64_t routed = 0;
  int64_t active = 0;
};

Expected expected_counts(Problem& p, int32_t tile, int32_t capacity) {
  const auto w = ref::from_weights(p.weights());
  const auto f = ref::ffn_forward(w, ref::from_view(p.x_view()));
  Expected e;
  const int64_t n = p.spec.n;
  for (int64_t r = 0; r < p.spec.m; ++r) {
    bool routed = false;
    for (int64_t t0 = 0; t0 < n; t0 += tile) {
      int64_t count = 0;
      for (int64_t c = t0; c < std::min<int64_t>(n, t0 + tile); ++c)
        count += round_to(p.spec.dtype, float(f.gate_pre.at(r, c))) > 0.0f;
      e.active += count;
      routed = routed || count > capacity;
    }
    e.routed += routed;
  }
  return e;
}

class CudaCounters : public ::testing::TestWithParam<Case> {};

TEST_P(CudaCounters, MatchOracle) {
  TWELL_REQUIRE_DEVICE();
  const Case& c = GetParam();
  DeviceProblem d(spec_of(c, 202));
  InferencePlan plan(d.weights(), options_of(c));
  const Outcome o = run_once(plan, d);
  const Expected e = expected_counts(d.p, plan.options().tile, plan.options().capacity);
  // Values within fp32 rounding of zero may flip between the fp64 oracle and the GPU GEMM.
  const int64_t slack = 2 + e.active / 10000;
  EXPECT_NEAR(double(o.counters[1]), double(e.active), double(slack)) << d.p.spec.describe();
  const bool decode = !o.info.ran_dense && c.m <= gpu::DecodeConfig::kMaxRows;  // routes nothing
  EXPECT_EQ(o.counters[0], decode ? 0 : e.routed) << d.p.spec.describe();
  EXPECT_EQ(o.info.routed_rows, -1);  // device-side only: read the counters instead
  EXPECT_EQ(o.info.active, -1);
  expect_matches_oracle(d, o.y, "counters run");
}

std::vector<Case> counter_cases() {
  std::vector<Case> out;
  for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
    for (const PatternDensity& pd : kAllPatterns) {
      out.push_back(problem_case<Case>(kind, DType::bf16, pd.pattern, pd.density, 257, 136, 1000));
    }
  Case narrow;
  narrow.pattern = Pattern::heavy_tailed;
  narrow.density = 0.03;
  narrow.m = 257;
  narrow.k = 136;
  narrow.n = 1000;
  narrow.tile = 64;
  narrow.capacity = 8;
  out.push_back(narrow);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Counters, CudaCounters, ::testing::ValuesIn(counter_cases()), case_name);


#endif  // TWELL_WITH_CUDA

}  // namespace
}  // namespace twell::test
