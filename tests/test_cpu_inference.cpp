// CPU inference vs the fp64 oracle over the generator set: dtypes, kinds, patterns, odd shapes,
// dispatch modes.
#include <algorithm>

#include "common.hpp"

namespace twell::test {
namespace {

struct Case {
  FfnKind kind;
  DType dtype;
  Pattern pattern;
  double density;
  int64_t m, k, n;
  Dispatch dispatch;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  const char* d = c.dispatch == Dispatch::automatic ? "auto"
                  : c.dispatch == Dispatch::force_sparse ? "sparse" : "dense";
  return std::string(ffn_kind_name(c.kind)) + "_" + dtype_name(c.dtype) + "_" +
         testing::pattern_name(c.pattern) + "_d" + std::to_string(int(c.density * 1000)) + "_M" +
         std::to_string(c.m) + "_K" + std::to_string(c.k) + "_N" + std::to_string(c.n) + "_" + d +
         "_" + std::to_string(info.index);
}

class CpuInference : public ::testing::TestWithParam<Case> {};

TEST_P(CpuInference, MatchesOracle) {
  const Case& c = GetParam();
  ProblemSpec spec{c.kind, c.m, c.k, c.n, c.dtype, c.pattern, c.density, 256, seed(uint64_t(c.m * 31 + c.n))};
  Problem p = testing::make_problem(spec);
  InferenceOptions opt;
  opt.dispatch = c.dispatch;
  InferencePlan plan(p.weights(), opt);
  std::vector<uint8_t> y(size_t(c.m * c.k) * dtype_size(c.dtype));
  poison(y.data(), y.size());
  int64_t counters[2] = {-1, -1};
  plan.run({p.x_view(), TensorView::matrix(y.data(), c.dtype, c.m, c.k),
            TensorView::vector(counters, DType::i64, 2)});
  const ForwardCheck chk = check_forward(p, y.data());
  EXPECT_LE(chk.error, chk.tolerance) << spec.describe();
  EXPECT_TRUE(chk.zero_rows_exact) << spec.describe();

  const RunInfo info = plan.last_run();
  EXPECT_EQ(info.rows, c.m);
  EXPECT_EQ(counters[0], info.routed_rows);
  EXPECT_EQ(counters[1], info.active);
  if (c.pattern == Pattern::all_zero) EXPECT_EQ(info.active, 0);
  if (c.pattern == Pattern::all_dense) EXPECT_EQ(info.active, c.m * c.n);
  if (c.dispatch == Dispatch::force_sparse) {
    EXPECT_FALSE(info.ran_dense);
    // Every fully dense row and every hot-tile row overflows capacity 32 of a 256-wide tile.
    if (c.pattern == Pattern::all_dense) EXPECT_EQ(info.routed_rows, c.m);
    if (c.pattern == Pattern::edge_rows && c.n >= 64) {
      int64_t must = 0;
      for (int64_t r : p.special_rows) {
        const float bias = load_float(p.x.data(), c.dtype, r * c.k + c.k - 3);
        const float hot = load_float(p.x.data(), c.dtype, r * c.k + c.k - 2);
        must += bias > 0 || hot > 0;  // dense or hot rows
      }
      EXPECT_GE(info.routed_rows, must);
    }
  }
  if (c.dispatch == Dispatch::force_dense) EXPECT_TRUE(info.ran_dense || c.m == 0);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const int64_t ms[] = {1, 7, 255, 257, 4097};
  const std::pair<int64_t, int64_t> kn[] = {{64, 520}, {40, 300}, {136, 1000}};
  const Pattern pats[] = {Pattern::uniform, Pattern::heavy_tailed, Pattern::trained_like, Pattern::edge_rows,
                          Pattern::all_zero, Pattern::all_dense};
  int i = 0;
  for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (Pattern pat : pats)
        for (int64_t m : ms) {
          const auto [k, n] = kn[size_t(i++) % 3];
          const Dispatch d = pat == Pattern::uniform && m == 257 ? Dispatch::force_dense
                             : m == 255                          ? Dispatch::automatic
                                                                 : Dispatch::force_sparse;
          out.push_back({kind, dt, pat, pat == Pattern::heavy_tailed ? 0.02 : 0.05, m, k, n, d});
        }
  // Density sweep across the dispatch threshold, and M = 0.
  for (double d : {0.005, 0.01, 0.2, 0.5})
    out.push_back({FfnKind::gated, DType::bf16, Pattern::uniform, d, 300, 72, 777, Dispatch::automatic});
  out.push_back({FfnKind::gated, DType::f32, Pattern::uniform, 0.1, 0, 64, 520, Dispatch::automatic});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Generators, CpuInference, ::testing::ValuesIn(cases()), case_name);

TEST(CpuInferenceApi, CallerWorkspaceAndOneShot) {
  Problem p = testing::make_problem({FfnKind::gated, 300, 64, 520, DType::bf16, Pattern::edge_rows, 0.05, 256, seed(21)});
  InferencePlan plan(p.weights());
  std::vector<uint16_t> y1(300 * 64), y2(300 * 64);
  const InferenceArgs args{p.x_view(), TensorView::matrix(y1.data(), DType::bf16, 300, 64), {}};
  std::vector<uint8_t> ws(plan.workspace_bytes(args));
  poison(ws.data(), ws.size());
  poison(y1.data(), y1.size() * 2);
  plan.run(args, nullptr, ws.data(), ws.size());
  ffn_forward(p.weights(), p.x_view(), TensorView::matrix(y2.data(), DType::bf16, 300, 64));
  EXPECT_EQ(y1, y2);
  const ForwardCheck chk = check_forward(p, y1.data());
  EXPECT_LE(chk.error, chk.tolerance);
}

TEST(CpuInferenceApi, CapacityOptionRoutesMoreRowsStillExact) {
  Problem p = testing::make_problem({FfnKind::gated, 200, 64, 520, DType::f32, Pattern::heavy_tailed, 0.05, 256, seed(22)});
  InferenceOptions o;
  o.tile = 64;
  o.capacity = 2;
  o.dispatch = Dispatch::force_sparse;
  InferencePlan plan(p.weights(), o);
  std::vector<float> y(200 * 64);
  poison(y.data(), y.size() * 4);
  plan.run({p.x_view(), TensorView::matrix(y.data(), DType::f32, 200, 64), {}});
  EXPECT_GT(plan.last_run().routed_rows, 10);
  const ForwardCheck chk = check_forward(p, y.data());
  EXPECT_LE(chk.error, chk.tolerance);
}

// A plan holds views of the caller's weights: changed in place between runs (an optimizer step),
// the next run computes with the new values, 16-bit weights (widened to fp32 inside) included.
TEST(CpuInferenceApi, WeightsChangedInPlaceBetweenRuns) {
  for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
    for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
      const ProblemSpec spec{kind, 33, 64, 520, dt, Pattern::uniform, 0.05, 256, seed(23)};
      Problem p = testing::make_problem(spec);
      ProblemSpec other = spec;
      other.seed = spec.seed + 1;
      const Problem q = testing::make_problem(other);
      InferencePlan plan(p.weights());
      std::vector<uint8_t> y(size_t(33 * 64) * dtype_size(dt));
      plan.run({p.x_view(), TensorView::matrix(y.data(), dt, 33, 64), {}});
      // into the same buffers, which the plan views
      std::copy(q.gate.begin(), q.gate.end(), p.gate.begin());
      std::copy(q.up.begin(), q.up.end(), p.up.begin());
      std::copy(q.down.begin(), q.down.end(), p.down.begin());
      poison(y.data(), y.size());
      plan.run({p.x_view(), TensorView::matrix(y.data(), dt, 33, 64), {}});
      const ForwardCheck chk = check_forward(p, y.data());
      EXPECT_LE(chk.error, chk.tolerance) << spec.describe();
    }
}

// Rows fewer than the threads (a decoding step) split each row's entries over the threads and add
// the partial sums: compact rows, routed rows (every unit of a row active), heavy tiles and the
// generator's edge rows, one row and a few, every kind and dtype, against the oracle.
TEST(CpuInferenceApi, DecodingRowsSplitOverThreads) {
  const int threads = cpu_count();
  if (threads < 2) GTEST_SKIP() << "one CPU: nothing to split over";
  set_cpu_threads(threads);
  struct Row {
    Pattern pattern;
    double density;
  };
  for (const FfnKind kind : {FfnKind::gated, FfnKind::plain})
    for (const DType dt : {DType::f32, DType::bf16, DType::f16})
      for (const Row r : {Row{Pattern::uniform, 0.3}, Row{Pattern::all_dense, 1.0},
                          Row{Pattern::heavy_tailed, 0.2}, Row{Pattern::edge_rows, 0.1}})
        for (const int64_t m : {int64_t(1), int64_t(threads - 1), int64_t(3)}) {
          if (m < 1) continue;
          const ProblemSpec spec{kind, m, 64, 1032, dt, r.pattern, r.density, 256,
                                 seed(uint64_t(40 + m))};
          Problem p = testing::make_problem(spec);
          InferencePlan plan(p.weights());
          std::vector<uint8_t> y(size_t(m * 64) * dtype_size(dt));
          poison(y.data(), y.size());
          plan.run({p.x_view(), TensorView::matrix(y.data(), dt, m, 64), {}});
          const ForwardCheck chk = check_forward(p, y.data());
          EXPECT_LE(chk.error, chk.tolerance) << spec.describe();
          EXPECT_TRUE(chk.zero_rows_exact) << spec.describe();
        }
  set_cpu_threads(0);
}

// set_weights points a plan at other weight memory of the same kind and shapes (Error otherwise).
TEST(CpuInferenceApi, SetWeightsRebindsAndChecks) {
  const ProblemSpec spec{FfnKind::gated, 40, 64, 520, DType::bf16, Pattern::heavy_tailed, 0.05, 256, seed(24)};
  ProblemSpec other = spec;
  other.seed = spec.seed + 1;
  Problem q = testing::make_problem(other);
  Problem first = testing::make_problem(spec);
  InferencePlan plan(first.weights());
  std::vector<uint8_t> y(size_t(40 * 64) * 2);
  plan.set_weights(q.weights());
  poison(y.data(), y.size());
  plan.run({q.x_view(), TensorView::matrix(y.data(), DType::bf16, 40, 64), {}});
  const ForwardCheck chk = check_forward(q, y.data());
  EXPECT_LE(chk.error, chk.tolerance) << other.describe();
  EXPECT_EQ(plan.weights().up.data, q.weights().up.data);
  Problem wider = testing::make_problem({FfnKind::gated, 4, 64, 528, DType::bf16, Pattern::uniform, 0.05, 256, seed(25)});
  Problem plain = testing::make_problem({FfnKind::plain, 4, 64, 520, DType::bf16, Pattern::uniform, 0.05, 256, seed(26)});
  Problem f32 = testing::make_problem({FfnKind::gated, 4, 64, 520, DType::f32, Pattern::uniform, 0.05, 256, seed(27)});
  for (Problem* bad : {&wider, &plain, &f32}) {
    try {
      plan.set_weights(bad->weights());
      ADD_FAILURE() << "set_weights accepted other weights";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("InferencePlan::set_weights"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace twell::test
