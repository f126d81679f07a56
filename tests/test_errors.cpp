// Bad inputs raise twell::Error naming the argument; nothing runs on them.
#include "common.hpp"

namespace twell::test {
namespace {

Problem small(FfnKind kind = FfnKind::gated, DType dt = DType::f32) {
  return testing::make_problem({kind, 4, 16, 40, dt, Pattern::uniform, 0.2, 256, seed(11)});
}

TEST(Errors, TransposedDownWeight) {
  Problem p = small();
  FfnWeights w = p.weights();
  w.down = TensorView::matrix(p.down.data(), DType::f32, 16, 40);  // [K, N]: nn.Linear's layout
  expect_named_error([&] { InferencePlan plan(w); }, "down weight", "expected [N=40, K=16], got [16, 40]");
}

TEST(Errors, WeightProblems) {
  Problem p = small();
  FfnWeights w = p.weights();
  w.gate.dtype = DType::bf16;
  expect_named_error([&] { InferencePlan plan(w); }, "gate weight", "float32");
  w = p.weights();
  w.gate = TensorView{};
  expect_named_error([&] { InferencePlan plan(w); }, "gate weight");
  w = p.weights();
  w.up.dtype = DType::i32;
  expect_named_error([&] { InferencePlan plan(w); }, "up weight");
  Problem q = small(FfnKind::plain);
  FfnWeights wp = q.weights();
  wp.gate = p.weights().gate;
  expect_named_error([&] { InferencePlan plan(wp); }, "gate weight", "none for a plain FFN");
  w = p.weights();
  w.up.stride = {1, 40, 0, 0};  // a transposed view: not row-major
  expect_named_error([&] { InferencePlan plan(w); }, "up weight");
}

TEST(Errors, ActivationProblems) {
  Problem p = small();
  InferencePlan plan(p.weights());
  std::vector<float> y(64), wide(4 * 17);
  TensorView x = p.x_view(), yv = TensorView::matrix(y.data(), DType::f32, 4, 16);
  expect_named_error([&] { plan.run({TensorView::matrix(wide.data(), DType::f32, 4, 17), yv, {}}); }, "x",
               "expected [M, 16], got [4, 17]");
  expect_named_error([&] { plan.run({x, TensorView::matrix(y.data(), DType::f32, 3, 16), {}}); }, "y");
  TensorView ybf = yv;
  ybf.dtype = DType::bf16;
  expect_named_error([&] { plan.run({x, ybf, {}}); }, "y", "bfloat16");
  TensorView xs = x;
  xs.stride = {32, 1, 0, 0};
  expect_named_error([&] { plan.run({xs, yv, {}}); }, "x", "contiguous");
  TensorView xc = x;
  xc.device = Device::cuda(0);
  expect_named_error([&] { plan.run({xc, yv, {}}); }, "x", "device cpu, got cuda:0");
  int32_t bad[2];
  expect_named_error([&] { plan.run({x, yv, TensorView::vector(bad, DType::i32, 2)}); }, "counters");
  EXPECT_FALSE(plan.can_run({x, ybf, {}}).ok);
  EXPECT_NE(plan.can_run({x, ybf, {}}).reason.find("y"), std::string::npos);
  EXPECT_TRUE(plan.can_run({x, yv, {}}).ok);
  std::vector<uint8_t> ws(8);
  expect_named_error([&] { plan.run({x, yv, {}}, nullptr, ws.data(), ws.size()); }, "workspace");
}

TEST(Errors, Options) {
  Problem p = small();
  InferenceOptions o;
  o.tile = 64;
  o.capacity = 65;
  expect_named_error([&] { InferencePlan plan(p.weights(), o); }, "options.capacity");
  o.tile = -1;
  expect_named_error([&] { InferencePlan plan(p.weights(), o); }, "options.tile");
  TrainingOptions t;
  t.l1_coef = -1;
  expect_named_error([&] { TrainingPlan plan(p.weights(), t); }, "options.l1_coef");
}

// An error names the op the caller called: a TrainingPlan's tile (checked as an InferencePlan's
// is), workspace_bytes' arguments (checked as run's are), and the dtypes a TwELL view accepts.
TEST(Errors, NameTheCallersOp) {
  Problem p = small();
  TrainingOptions t;
  t.tile = 70000;
  try {
    TrainingPlan plan(p.weights(), t);
    ADD_FAILURE() << "tile 70000 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), "TrainingPlan") << e.what();
    EXPECT_EQ(e.argument(), "options.tile") << e.what();
  }
  InferencePlan plan(p.weights());
  std::vector<float> y(63);
  try {
    (void)plan.workspace_bytes({p.x_view(), TensorView::matrix(y.data(), DType::f32, 4, 15), {}});
    ADD_FAILURE() << "a y of the wrong shape accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), "InferencePlan::workspace_bytes") << e.what();
    EXPECT_EQ(e.argument(), "y") << e.what();
  }
  TwellShape s;
  s.rows = 1, s.cols = 8, s.tile = 8, s.capacity = 1;
  std::vector<uint8_t> bytes(s.bytes(DType::f32));
  expect_named_error([&] { make_twell_view(bytes.data(), s, DType::i32, Device::cpu()); }, "dtype",
                     "expected float32, float16 or bfloat16, got int32");
}

TEST(Errors, Training) {
  Problem p = small();
  TrainingPlan plan(p.weights());
  std::vector<float> y(64), dx(64), g(640), u(640), d(640);
  TensorView yv = TensorView::matrix(y.data(), DType::f32, 4, 16);
  SavedActivations saved;
  TrainingBackwardArgs b{yv, TensorView::matrix(dx.data(), DType::f32, 4, 16),
                         TensorView::matrix(g.data(), DType::f32, 40, 16),
                         TensorView::matrix(u.data(), DType::f32, 40, 16),
                         TensorView::matrix(d.data(), DType::f32, 40, 16)};
  expect_named_error([&] { plan.backward(b, saved); }, "saved");
  plan.forward({p.x_view(), yv, {}}, saved);
  TrainingBackwardArgs bad = b;
  bad.ddown = TensorView::matrix(d.data(), DType::f32, 16, 40);
  expect_named_error([&] { plan.backward(bad, saved); }, "ddown");
  bad = b;
  bad.dup.dtype = DType::bf16;
  expect_named_error([&] { plan.backward(bad, saved); }, "dup");
  float stats[2];
  expect_named_error([&] { plan.forward({p.x_view(), yv, TensorView::vector(stats, DType::f32, 3)}, saved); },
               "stats");
  EXPECT_EQ(plan.workspace_bytes(4), 0u);  // the CPU backend keeps its scratch itself
  expect_named_error([&] { plan.forward({p.x_view(), yv, {}, TensorView::vector(stats, DType::f32, 2)}, saved); },
               "workspace");
}

TEST(Errors, CudaTensorsWithoutCudaBuildOrDevice) {
  if (cuda_compiled()) GTEST_SKIP() << "this build has the CUDA backend; see test_cuda_inference";
  Problem p = small();
  FfnWeights w = p.weights();
  w.gate.device = w.up.device = w.down.device = Device::cuda(0);
  expect_named_error([&] { InferencePlan plan(w); }, "weights device");
}

}  // namespace
}  // namespace twell::test
