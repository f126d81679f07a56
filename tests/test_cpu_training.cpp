// CPU training: forward (y, L0, L1) and every gradient vs the oracle, with the L1 term.
#include "common.hpp"

#include <algorithm>

#include "core/backend.hpp"
#include "core/capacity.hpp"

namespace twell::test {
namespace {

struct Case {
  FfnKind kind;
  DType dtype;
  Pattern pattern;
  int64_t m, k, n;
  int32_t capacity;
};

class CpuTraining : public ::testing::TestWithParam<Case> {};

ref::Matrix f32_matrix(const std::vector<float>& v, int64_t r, int64_t c) {
  return ref::from_view(TensorView::matrix(const_cast<float*>(v.data()), DType::f32, r, c));
}

// Tolerance for an output stored in dtype t: 2x the error of rounding the oracle to t, plus a floor.
double grad_tol(const ref::Matrix& r, DType t) {
  ref::Matrix rounded = r;
  for (double& v : rounded.v) v = round_to(t, float(v));
  return 2 * ref::rel_error(rounded, r) + (t == DType::f32 ? 2e-5 : 1e-3);
}

TEST_P(CpuTraining, GradientsMatchOracle) {
  const Case& c = GetParam();
  const bool gated = c.kind == FfnKind::gated;
  ProblemSpec spec{c.kind, c.m, c.k, c.n, c.dtype, c.pattern, 0.05, 64, seed(uint64_t(c.m + 7 * c.n))};
  Problem p = testing::make_problem(spec);
  Problem g = testing::make_problem({c.kind, c.m, c.k, 1, c.dtype, Pattern::uniform, 0.5, 64, spec.seed + 1});
  std::vector<uint8_t>& dy = g.x;  // an independent random [M, K] upstream gradient
  TrainingOptions opt;
  opt.l1_coef = 0.05;
  opt.tile = 64;
  opt.capacity = c.capacity;
  TrainingPlan plan(p.weights(), opt);
  const size_t es = dtype_size(c.dtype);
  std::vector<uint8_t> y(size_t(c.m * c.k) * es), dx(y.size());
  std::vector<float> dgate(size_t(c.n * c.k)), dup(dgate.size()), ddown(dgate.size()), stats(2);
  for (auto* b : {&y, &dx}) poison(b->data(), b->size());
  for (auto* b : {&dgate, &dup, &ddown, &stats}) poison(b->data(), b->size() * 4);
  SavedActivations saved;
  plan.forward({p.x_view(), TensorView::matrix(y.data(), c.dtype, c.m, c.k),
                TensorView::vector(stats.data(), DType::f32, 2)},
               saved);
  plan.backward({TensorView::matrix(dy.data(), c.dtype, c.m, c.k),
                 TensorView::matrix(dx.data(), c.dtype, c.m, c.k),
                 gated ? TensorView::matrix(dgate.data(), DType::f32, c.n, c.k) : TensorView{},
                 TensorView::matrix(dup.data(), DType::f32, c.n, c.k),
                 TensorView::matrix(ddown.data(), DType::f32, c.n, c.k)},
                saved);

  const ref::Weights w = ref::from_weights(p.weights());
  const ref::Matrix x = ref::from_view(p.x_view());
  const ref::Matrix dyr = ref::from_view(TensorView::matrix(dy.data(), c.dtype, c.m, c.k));
  const ref::Forward f = ref::ffn_forward(w, x);
  const ref::Grads gr = ref::ffn_backward(w, x, dyr, opt.l1_coef);
  const std::string what = spec.describe();
  const ref::Matrix yo = ref::from_view(TensorView::matrix(y.data(), c.dtype, c.m, c.k));
  const ref::Matrix dxo = ref::from_view(TensorView::matrix(dx.data(), c.dtype, c.m, c.k));
  EXPECT_LE(ref::rel_error(yo, f.y), test::tolerance(w, x, f, c.dtype)) << what;
  const testing::Fp32Slack slack = testing::fp32_slack(w, x, dyr, f, opt.l1_coef);
  using testing::with_slack;
  EXPECT_LE(ref::rel_error(dxo, gr.dx), with_slack(grad_tol(gr.dx, c.dtype), slack.dx, gr.dx)) << what;
  if (gated)
    EXPECT_LE(ref::rel_error(f32_matrix(dgate, c.n, c.k), gr.dgate),
              with_slack(grad_tol(gr.dgate, DType::f32), slack.dfirst, gr.dgate))
        << what;
  EXPECT_LE(ref::rel_error(f32_matrix(dup, c.n, c.k), gr.dup),
            with_slack(grad_tol(gr.dup, DType::f32), gated ? slack.dsecond : slack.dfirst, gr.dup))
      << what;
  EXPECT_LE(ref::rel_error(f32_matrix(ddown, c.n, c.k), gr.ddown),
            with_slack(grad_tol(gr.ddown, DType::f32), slack.ddown, gr.ddown))
      << what;
  EXPECT_NEAR(stats[0], ref::l0_per_token(f), 1e-3 * (1 + ref::l0_per_token(f))) << what;
  EXPECT_NEAR(stats[1], ref::l1_per_token(f), 1e-4 * (1 + ref::l1_per_token(f))) << what;
  EXPECT_GT(saved.bytes(), 0u);
  if (c.pattern == Pattern::all_dense) EXPECT_EQ(saved.routed_rows(), c.m);

  // Deterministic: a second backward into fresh, poisoned buffers gives bit-identical gradients.
  std::vector<float> dgate2(dgate.size()), dup2(dup.size()), ddown2(ddown.size());
  std::vector<uint8_t> dx2(dx.size());
  poison(dx2.data(), dx2.size());
  for (auto* b : {&dgate2, &dup2, &ddown2}) poison(b->data(), b->size() * 4);
  plan.backward({TensorView::matrix(dy.data(), c.dtype, c.m, c.k),
                 TensorView::matrix(dx2.data(), c.dtype, c.m, c.k),
                 gated ? TensorView::matrix(dgate2.data(), DType::f32, c.n, c.k) : TensorView{},
                 TensorView::matrix(dup2.data(), DType::f32, c.n, c.k),
                 TensorView::matrix(ddown2.data(), DType::f32, c.n, c.k)},
                saved);
  auto same_bits = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  if (gated) EXPECT_TRUE(same_bits(dgate, dgate2)) << what;
  EXPECT_TRUE(same_bits(dup, dup2)) << what;
  EXPECT_TRUE(same_bits(ddown, ddown2)) << what;
  EXPECT_TRUE(same_bits(dx, dx2)) << what;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (Pattern pat : {Pattern::uniform, Pattern::heavy_tailed, Pattern::trained_like, Pattern::edge_rows,
                          Pattern::all_zero, Pattern::all_dense})
        for (int64_t m : {1, 7, 129}) out.push_back({kind, dt, pat, m, 24, 200, m == 7 ? 2 : 8});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Generators, CpuTraining, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           const Case& c = i.param;
                           return std::string(ffn_kind_name(c.kind)) + "_" + dtype_name(c.dtype) +
                                  "_" + testing::pattern_name(c.pattern) + "_M" +
                                  std::to_string(c.m) + "_" + std::to_string(i.index);
                         });

// Options left at 0: tile 256 and, for the state training saves, tile / 16 slots (inference's pack
// keeps tile / 8); a tile of its own gives its own sixteenth, and a capacity given is kept.
TEST(CpuTrainingApi, DefaultCapacityIsASixteenthOfTheTile) {
  Problem p = testing::make_problem({FfnKind::gated, 8, 24, 200, DType::f32, Pattern::uniform, 0.05, 64, seed(40)});
  EXPECT_EQ(TrainingPlan(p.weights()).options().capacity, 16);
  EXPECT_EQ(TrainingPlan(p.weights()).saved_shape(8).capacity, 16);
  EXPECT_EQ(InferencePlan(p.weights()).options().capacity, 32);
  TrainingOptions opt;
  opt.tile = 64;
  EXPECT_EQ(TrainingPlan(p.weights(), opt).options().capacity, 4);
  opt.tile = 8;
  EXPECT_EQ(TrainingPlan(p.weights(), opt).options().capacity, 1);
  opt.capacity = 8;
  EXPECT_EQ(TrainingPlan(p.weights(), opt).options().capacity, 8);
  opt.tile = -1;
  EXPECT_THROW(TrainingPlan(p.weights(), opt), Error);
}

// min_capacity: a default capacity under automatic dispatch on CUDA may be sized down to tile / 64
// (at least 1), or to a min_capacity given; a capacity given, force_sparse or force_dense, and the
// CPU backend keep one capacity; a min_capacity outside 0..capacity is refused by name.
TEST(CpuTrainingApi, MinCapacityResolves) {
  using detail::resolve_training_options;
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  TrainingOptions o;
  TrainingOptions r = resolve_training_options(o, gpu);
  EXPECT_EQ(r.capacity, 16);
  EXPECT_EQ(r.min_capacity, 4);
  EXPECT_EQ(resolve_training_options(o, cpu).min_capacity, 16);
  o.tile = 64;  // tile / 16 = 4 slots: nothing below the default minimum of 4
  EXPECT_EQ(resolve_training_options(o, gpu).min_capacity, 4);
  o.tile = 128;
  EXPECT_EQ(resolve_training_options(o, gpu).capacity, 8);
  EXPECT_EQ(resolve_training_options(o, gpu).min_capacity, 4);
  o.tile = 1024;
  EXPECT_EQ(resolve_training_options(o, gpu).min_capacity, 16);
  o.tile = 0;
  o.min_capacity = 8;
  EXPECT_EQ(resolve_training_options(o, gpu).min_capacity, 8);
  o.min_capacity = 0;
  o.capacity = 12;  // a capacity given is kept ...
  EXPECT_EQ(resolve_training_options(o, gpu).min_capacity, 12);
  o.min_capacity = 3;  // ... unless a min_capacity is given too
  EXPECT_EQ(resolve_training_options(o, gpu).min_capacity, 3);
  EXPECT_EQ(resolve_training_options(o, cpu).min_capacity, 12);
  o.min_capacity = 0;
  o.capacity = 0;
  for (Dispatch d : {Dispatch::force_sparse, Dispatch::force_dense}) {
    o.dispatch = d;
    EXPECT_EQ(resolve_training_options(o, gpu).min_capacity, 16);
  }
  o.dispatch = Dispatch::automatic;
  for (int32_t bad : {-1, 17}) {
    o.min_capacity = bad;
    try {
      (void)resolve_training_options(o, gpu);
      ADD_FAILURE() << "min_capacity " << bad << " was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "options.min_capacity") << e.what();
    }
  }
}

// The rule that sizes the compact state (core/capacity.hpp): the smallest candidate holding 16x a
// tile's mean entries, and a floor one candidate above a capacity whose forward routed more than
// M / 256 rows.
TEST(CpuTrainingApi, CapacityChoiceFollowsDensityAndRoutedRows) {
  using detail::saved_capacities;
  EXPECT_EQ(saved_capacities(16, 4), (std::vector<int32_t>{16, 8, 4}));
  EXPECT_EQ(saved_capacities(12, 3), (std::vector<int32_t>{12, 6, 3}));
  EXPECT_EQ(saved_capacities(1, 1), (std::vector<int32_t>{1}));
  EXPECT_EQ(saved_capacities(4, 4), (std::vector<int32_t>{4}));
  for (int32_t c = 0; c <= 17; ++c) {  // membership without the list agrees with the list
    const std::vector<int32_t> all = saved_capacities(16, 4);
    EXPECT_EQ(detail::is_saved_capacity(c, 16, 4), std::find(all.begin(), all.end(), c) != all.end()) << c;
  }
  detail::CapacityChoice c(256, 16, 4);
  EXPECT_EQ(c.choose(-1), 16);      // nothing measured yet
  EXPECT_EQ(c.choose(0.0), 4);
  EXPECT_EQ(c.choose(0.0001), 4);   // 16 x 0.0256 entries a tile = 0.41
  EXPECT_EQ(c.choose(0.00097), 4);  // 3.97
  EXPECT_EQ(c.choose(0.001), 8);    // 4.10
  EXPECT_EQ(c.choose(0.0019), 8);   // 7.78
  EXPECT_EQ(c.choose(0.005), 16);
  EXPECT_EQ(c.choose(0.5), 16);     // above every candidate: the largest
  c.routed(16384, 4, 64);           // exactly M / 256: kept
  EXPECT_EQ(c.choose(0.0001), 4);
  c.routed(16384, 4, 65);
  EXPECT_EQ(c.floor(), 8);
  EXPECT_EQ(c.choose(0.0001), 8);
  EXPECT_EQ(c.choose(0.005), 16);
  c.routed(16384, 4, 1000);         // a stale count at 4: the floor stays where it is
  EXPECT_EQ(c.floor(), 8);
  c.routed(16384, 16, 16384);       // nothing above the largest
  EXPECT_EQ(c.floor(), 8);
  c.routed(0, 8, 5);
  EXPECT_EQ(c.floor(), 8);
  c.routed(16384, 8, 100);
  EXPECT_EQ(c.choose(0.0), 16);
  // kCapacityRetryForwards clean forwards at the raised floor lower it a step again.
  for (int i = 0; i < 99; ++i) c.routed(16384, 16, 64);
  EXPECT_EQ(c.floor(), 16);
  c.routed(16384, 4, 0);  // a forward at another capacity does not count
  c.routed(16384, 16, 0);
  EXPECT_EQ(c.floor(), 8);
  EXPECT_EQ(c.choose(0.0), 8);
  for (int i = 0; i < 100; ++i) c.routed(16384, 8, 0);
  EXPECT_EQ(c.floor(), 4);
  for (int i = 0; i < 200; ++i) c.routed(16384, 4, 0);  // the lowest: nothing below
  EXPECT_EQ(c.floor(), 4);
}

// On the CPU backend every saved state has the options' capacity: one compact shape.
TEST(CpuTrainingApi, SavedShapesOnTheCpu) {
  Problem p = testing::make_problem({FfnKind::gated, 8, 24, 200, DType::f32, Pattern::uniform, 0.05, 64, seed(42)});
  const TrainingPlan plan(p.weights());
  EXPECT_EQ(plan.options().min_capacity, plan.options().capacity);
  for (int64_t m : {0, 1, 65}) {
    const std::vector<TwellShape> shapes = plan.saved_shapes(m);
    ASSERT_EQ(shapes.size(), 1u);
    EXPECT_EQ(shapes[0].bytes(DType::f32), plan.saved_shape(m).bytes(DType::f32));
    EXPECT_EQ(shapes[0].capacity, 16);
    EXPECT_EQ(shapes[0].backup_capacity, 0);
  }
}

// The caller-owned form (one byte buffer, as a framework tensor would hold it) gives the same result
// as the plan-allocated one, and a mismatched saved shape is refused.
TEST(CpuTrainingApi, CallerOwnedSavedStateMatches) {
  Problem p = testing::make_problem({FfnKind::gated, 65, 24, 200, DType::bf16, Pattern::edge_rows, 0.05, 64, seed(41)});
  TrainingOptions opt;
  opt.tile = 64, opt.capacity = 4, opt.l1_coef = 0.01;
  TrainingPlan plan(p.weights(), opt);
  const TwellShape shape = plan.saved_shape(65);
  EXPECT_EQ(shape.backup_capacity, 0);
  EXPECT_EQ(shape.planes, 2);
  // Each form's shape on request (the CPU backend asks for the compact one and runs only it).
  const TwellShape compact = plan.saved_shape(65, SavedForm::compact);
  const TwellShape dense = plan.saved_shape(65, SavedForm::dense);
  EXPECT_EQ(compact.bytes(DType::f32), shape.bytes(DType::f32));
  EXPECT_EQ(compact.capacity, 4);
  EXPECT_EQ(dense.capacity, 1);
  EXPECT_EQ(dense.backup_capacity, 65);
  EXPECT_EQ(plan.saved_shape(0, SavedForm::dense).backup_capacity, 0);
  std::vector<uint8_t> buffer(shape.bytes(plan.saved_dtype()));
  poison(buffer.data(), buffer.size());
  const TwellView view = make_twell_view(buffer.data(), shape, plan.saved_dtype(), Device::cpu());
  std::vector<uint16_t> y1(65 * 24), y2(65 * 24), dx1(65 * 24), dx2(65 * 24);
  std::vector<float> g1(200 * 24), u1(g1.size()), d1(g1.size()), g2(g1.size()), u2(g1.size()), d2(g1.size());
  auto mat = [](auto& v, DType t, int64_t r, int64_t c) { return TensorView::matrix(v.data(), t, r, c); };
  plan.forward({p.x_view(), mat(y1, DType::bf16, 65, 24), {}}, view);
  EXPECT_GT(*view.num_routed, 0);
  plan.backward({p.x_view(), mat(dx1, DType::bf16, 65, 24), mat(g1, DType::f32, 200, 24),
                 mat(u1, DType::f32, 200, 24), mat(d1, DType::f32, 200, 24)},
                p.x_view(), view);
  SavedActivations saved;
  plan.forward({p.x_view(), mat(y2, DType::bf16, 65, 24), {}}, saved);
  plan.backward({p.x_view(), mat(dx2, DType::bf16, 65, 24), mat(g2, DType::f32, 200, 24),
                 mat(u2, DType::f32, 200, 24), mat(d2, DType::f32, 200, 24)},
                saved);
  EXPECT_EQ(y1, y2);
  EXPECT_EQ(dx1, dx2);
  EXPECT_EQ(g1, g2);
  EXPECT_EQ(u1, u2);
  EXPECT_EQ(d1, d2);
  EXPECT_EQ(saved.routed_rows(), *view.num_routed);
  EXPECT_EQ(saved.bytes(), buffer.size());

  TwellShape wrong = shape;
  wrong.rows = 64;
  std::vector<uint8_t> small(wrong.bytes(DType::f32));
  try {
    plan.forward({p.x_view(), mat(y1, DType::bf16, 65, 24), {}},
                 make_twell_view(small.data(), wrong, DType::f32, Device::cpu()));
    ADD_FAILURE() << "expected twell::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "saved shape");
  }
}

// set_weights points a plan at other weight memory: the step then equals a fresh plan's on it.
TEST(CpuTrainingApi, SetWeightsRebindsTheViews) {
  Problem p = testing::make_problem({FfnKind::gated, 33, 24, 200, DType::f32, Pattern::uniform, 0.1, 64, seed(51)});
  Problem q = testing::make_problem({FfnKind::gated, 33, 24, 200, DType::f32, Pattern::heavy_tailed, 0.1, 64, seed(52)});
  TrainingPlan rebound(p.weights()), fresh(q.weights());
  rebound.set_weights(q.weights());
  std::vector<float> y1(33 * 24), y2(33 * 24);
  SavedActivations s1, s2;
  rebound.forward({q.x_view(), TensorView::matrix(y1.data(), DType::f32, 33, 24), {}}, s1);
  fresh.forward({q.x_view(), TensorView::matrix(y2.data(), DType::f32, 33, 24), {}}, s2);
  EXPECT_EQ(y1, y2);
  Problem wider = testing::make_problem({FfnKind::gated, 33, 24, 208, DType::f32, Pattern::uniform, 0.1, 64, seed(53)});
  EXPECT_THROW(rebound.set_weights(wider.weights()), Error);
  Problem plain = testing::make_problem({FfnKind::plain, 33, 24, 200, DType::f32, Pattern::uniform, 0.1, 64, seed(54)});
  EXPECT_THROW(rebound.set_weights(plain.weights()), Error);
}

}  // namespace
}  // namespace twell::test
