// Arguments that share memory, negative dimensions and empty batches: every overlap of an output
// with an input, the workspace or another output raises an Error naming both; a negative dimension
// raises; M = 0 runs and writes only what it owns.
#include <algorithm>

#include "common.hpp"

namespace twell::test {
namespace {

constexpr int64_t kM = 4, kK = 16, kN = 40;

Problem small(uint64_t salt, DType dt = DType::f32) {
  return testing::make_problem({FfnKind::gated, kM, kK, kN, dt, Pattern::uniform, 0.2, 256, seed(salt)});
}

TensorView rows_at(std::vector<float>& buf, int64_t first_row, int64_t rows) {
  return TensorView::matrix(buf.data() + first_row * kK, DType::f32, rows, kK);
}

InferenceOptions sparse() {
  InferenceOptions o;
  o.dispatch = Dispatch::force_sparse;
  return o;
}

TEST(ArgsOverlap, OutputOnItsInputRaisesOnTheSparsePath) {
  Problem p = small(101);
  InferencePlan plan(p.weights(), sparse());
  std::vector<float> buf(kM * kK);
  std::memcpy(buf.data(), p.x.data(), p.x.size());
  const TensorView xy = rows_at(buf, 0, kM);
  expect_named_error([&] { plan.run({xy, xy, {}}); }, "y", "no overlap with x");
  const Status s = plan.can_run({xy, xy, {}});
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("no overlap with x"), std::string::npos) << s.reason;
  // Nothing ran: x is untouched.
  EXPECT_EQ(std::memcmp(buf.data(), p.x.data(), p.x.size()), 0);
}

TEST(ArgsOverlap, PartialOverlapsRaiseAndAdjacentBuffersRun) {
  Problem p = small(102);
  InferencePlan plan(p.weights(), sparse());
  std::vector<float> buf((2 * kM + 1) * kK);
  std::memcpy(buf.data(), p.x.data(), p.x.size());
  const TensorView x = rows_at(buf, 0, kM);
  expect_named_error([&] { plan.run({x, rows_at(buf, kM - 1, kM), {}}); }, "y", "no overlap with x");
  TensorView one_float = rows_at(buf, kM, kM);
  one_float.data = reinterpret_cast<char*>(one_float.data) - sizeof(float);
  expect_named_error([&] { plan.run({x, one_float, {}}); }, "y", "no overlap with x");
  TensorView on_down = rows_at(buf, kM, kM);
  on_down.data = p.down.data() + 4;  // inside the down weight
  expect_named_error([&] { plan.run({x, on_down, {}}); }, "y", "no overlap with down weight");
  const TensorView y = rows_at(buf, kM, kM);
  poison(y.data, size_t(kM * kK) * 4);
  TensorView counters = TensorView::vector(buf.data() + kM * kK + 2, DType::i64, 2);
  expect_named_error([&] { plan.run({x, y, counters}); }, "y", "no overlap with counters");
  plan.run({x, y, {}});  // y right after x: no shared byte
  const ForwardCheck chk = check_forward(p, y.data);
  EXPECT_LE(chk.error, chk.tolerance);
}

TEST(ArgsOverlap, CallerWorkspaceMustNotOverlapOutputsOrInputs) {
  Problem p = small(103);
  InferencePlan plan(p.weights(), sparse());
  std::vector<float> y(kM * kK);
  const InferenceArgs args{p.x_view(), TensorView::matrix(y.data(), DType::f32, kM, kK), {}};
  const size_t need = plan.workspace_bytes(args);
  ASSERT_GT(need, 0u);
  std::vector<uint8_t> buf(need + y.size() * 4);
  const InferenceArgs in_buf{p.x_view(), TensorView::matrix(buf.data(), DType::f32, kM, kK), {}};
  const size_t align = 16;  // a caller workspace's alignment
  expect_named_error([&] { plan.run(in_buf, nullptr, buf.data() + align, need); }, "y", "no overlap with workspace");
  std::vector<uint8_t> x_then_workspace(p.x.size() + need);
  std::memcpy(x_then_workspace.data(), p.x.data(), p.x.size());
  const InferenceArgs x_in_buf{TensorView::matrix(x_then_workspace.data(), DType::f32, kM, kK), args.y, {}};
  ASSERT_EQ(p.x.size() % align, 0u);
  uint8_t* last_x_bytes = x_then_workspace.data() + p.x.size() - align;
  expect_named_error([&] { plan.run(x_in_buf, nullptr, last_x_bytes, need); }, "workspace", "no overlap with x");
  plan.run(x_in_buf, nullptr, last_x_bytes + align, need);
  plan.run(in_buf, nullptr, buf.data() + y.size() * 4, need);
}

// A TwELL buffer for the plan's saved state of `rows` rows, with its view.
struct SavedBuffer {
  std::vector<uint8_t> bytes;
  TwellView view;
  SavedBuffer(const TrainingPlan& plan, int64_t rows) {
    const TwellShape s = plan.saved_shape(rows);
    bytes.resize(std::max<size_t>(s.bytes(plan.saved_dtype()), 1));
    poison(bytes.data(), bytes.size());
    view = make_twell_view(bytes.data(), s, plan.saved_dtype(), Device::cpu());
  }
};

struct Grads {
  std::vector<float> dx = std::vector<float>(kM * kK), dgate = std::vector<float>(kN * kK),
                     dup = std::vector<float>(kN * kK), ddown = std::vector<float>(kN * kK);
  TrainingBackwardArgs args(Problem& dy) {
    return {dy.x_view(), TensorView::matrix(dx.data(), DType::f32, kM, kK),
            TensorView::matrix(dgate.data(), DType::f32, kN, kK),
            TensorView::matrix(dup.data(), DType::f32, kN, kK),
            TensorView::matrix(ddown.data(), DType::f32, kN, kK)};
  }
};

TEST(ArgsOverlap, TrainingForwardOutputs) {
  Problem p = small(104);
  TrainingPlan plan(p.weights());
  SavedBuffer saved(plan, kM);
  std::vector<float> y(kM * kK), stats(2);
  const TensorView yv = TensorView::matrix(y.data(), DType::f32, kM, kK);
  const TensorView sv = TensorView::vector(stats.data(), DType::f32, 2);
  expect_named_error([&] { plan.forward({p.x_view(), p.x_view(), sv}, saved.view); }, "y", "no overlap with x");
  const TensorView stats_on_saved = TensorView::vector(saved.view.values, DType::f32, 2);
  expect_named_error([&] { plan.forward({p.x_view(), yv, stats_on_saved}, saved.view); }, "stats",
                     "no overlap with saved values");
  TwellView saved_on_gate = saved.view;
  saved_on_gate.counts = reinterpret_cast<uint16_t*>(p.gate.data());
  expect_named_error([&] { plan.forward({p.x_view(), yv, sv}, saved_on_gate); }, "saved counts",
                     "no overlap with gate weight");
  plan.forward({p.x_view(), yv, sv}, saved.view);
}

TEST(ArgsOverlap, TrainingBackwardOutputs) {
  Problem p = small(105), dy = small(106);
  TrainingPlan plan(p.weights());
  SavedBuffer saved(plan, kM);
  std::vector<float> y(kM * kK);
  plan.forward({p.x_view(), TensorView::matrix(y.data(), DType::f32, kM, kK), {}}, saved.view);
  Grads g;
  TrainingBackwardArgs b = g.args(dy);
  b.dx = dy.x_view();
  expect_named_error([&] { plan.backward(b, p.x_view(), saved.view); }, "dx", "no overlap with dy");
  b = g.args(dy);
  b.ddown.data = g.dgate.data() + kK;
  expect_named_error([&] { plan.backward(b, p.x_view(), saved.view); }, "dgate", "no overlap with ddown");
  b = g.args(dy);
  b.dx = TensorView::matrix(saved.view.values, DType::f32, kM, kK);  // inside the saved values
  expect_named_error([&] { plan.backward(b, p.x_view(), saved.view); }, "dx", "no overlap with saved values");
  b = g.args(dy);
  float coef = 0.5f;
  b.l1_coef = TensorView::vector(&coef, DType::f32, 1);
  b.dx = TensorView::matrix(&coef, DType::f32, kM, kK);
  expect_named_error([&] { plan.backward(b, p.x_view(), saved.view); }, "dx", "no overlap with l1_coef");
  b = g.args(dy);
  b.dgate = TensorView::matrix(p.up.data(), DType::f32, kN, kK);
  expect_named_error([&] { plan.backward(b, p.x_view(), saved.view); }, "dgate", "no overlap with up weight");
  plan.backward(g.args(dy), p.x_view(), saved.view);
}

TEST(ArgsShapes, NegativeDimensionsRaise) {
  Problem p = small(107);
  InferencePlan plan(p.weights());
  std::vector<float> y(kM * kK);
  TensorView neg = p.x_view();
  neg.shape[0] = -3;
  const TensorView yv = TensorView::matrix(y.data(), DType::f32, kM, kK);
  expect_named_error([&] { plan.run({neg, yv, {}}); }, "x", "non-negative dimensions");
  EXPECT_FALSE(plan.can_run({neg, yv, {}}).ok);
  TensorView yneg = yv;
  yneg.shape[0] = -3;
  expect_named_error([&] { plan.run({neg, yneg, {}}); }, "x", "non-negative dimensions");
  EXPECT_EQ(plan.last_run().rows, 0);
  TensorView high_rank = p.x_view();
  high_rank.rank = TensorView::kMaxRank + 1;
  expect_named_error([&] { plan.run({high_rank, yv, {}}); }, "x", "rank 0..4");

  TrainingPlan training(p.weights());
  SavedActivations saved;
  expect_named_error([&] { training.forward({neg, yneg, {}}, saved); }, "x", "non-negative dimensions");
  SavedBuffer buf(training, kM);
  training.forward({p.x_view(), yv, {}}, buf.view);
  Grads g;
  Problem dy = small(108);
  TrainingBackwardArgs b = g.args(dy);
  expect_named_error([&] { training.backward(b, neg, buf.view); }, "x", "non-negative dimensions");
  b.dup.shape[1] = -kK;
  expect_named_error([&] { training.backward(b, p.x_view(), buf.view); }, "dup", "non-negative dimensions");
  std::vector<uint8_t> ws(64);
  const TensorView neg_ws = TensorView::vector(ws.data(), DType::u8, -64);
  expect_named_error([&] { training.forward({p.x_view(), yv, {}, neg_ws}, buf.view); }, "workspace",
                     "non-negative dimensions");
  int64_t counters[2];
  const TensorView neg_counters = TensorView::vector(counters, DType::i64, -2);
  expect_named_error([&] { plan.run({p.x_view(), yv, neg_counters}); }, "counters", "non-negative dimensions");
  TensorView negative_view = yv;
  negative_view.shape = {-3, -4, 0, 0};
  EXPECT_THROW(negative_view.numel(), Error);
}

// M = 0: nothing to compute; the weight gradients are zero, the stats zero, no byte outside the
// outputs is written, and no null pointer reaches memcpy (x, y, dy and dx have no storage).
TEST(ArgsShapes, EmptyBatchTrainingWritesZeroGradients) {
  for (FfnKind kind : {FfnKind::gated, FfnKind::plain}) {
    Problem p = testing::make_problem({kind, 0, kK, kN, DType::f32, Pattern::uniform, 0.2, 256, seed(109)});
    TrainingOptions o;
    o.l1_coef = 0.1;
    TrainingPlan plan(p.weights(), o);
    const TensorView empty = TensorView::matrix(nullptr, DType::f32, 0, kK);
    constexpr size_t kGuard = 64;  // floats after each gradient that must stay poisoned
    const size_t grad = size_t(kN * kK);
    std::vector<float> stats(2 + kGuard), dgate(grad + kGuard), dup(grad + kGuard), ddown(grad + kGuard);
    for (auto* v : {&stats, &dgate, &dup, &ddown}) poison(v->data(), v->size() * 4);
    SavedBuffer saved(plan, 0);
    plan.forward({empty, empty, TensorView::vector(stats.data(), DType::f32, 2)}, saved.view);
    plan.backward({empty, empty,
                   kind == FfnKind::gated ? TensorView::matrix(dgate.data(), DType::f32, kN, kK) : TensorView{},
                   TensorView::matrix(dup.data(), DType::f32, kN, kK),
                   TensorView::matrix(ddown.data(), DType::f32, kN, kK)},
                  empty, saved.view);
    EXPECT_EQ(stats[0], 0.0f);
    EXPECT_EQ(stats[1], 0.0f);
    for (size_t i = 0; i < grad; ++i) {
      if (kind == FfnKind::gated) ASSERT_EQ(dgate[i], 0.0f) << i;
      ASSERT_EQ(dup[i], 0.0f) << i;
      ASSERT_EQ(ddown[i], 0.0f) << i;
    }
    auto poisoned = [](const std::vector<float>& v, size_t from) {
      return std::all_of(v.begin() + long(from), v.end(), [](float f) { return std::isnan(f); });
    };
    EXPECT_TRUE(poisoned(stats, 2));
    EXPECT_TRUE(poisoned(dgate, kind == FfnKind::gated ? grad : 0));
    EXPECT_TRUE(poisoned(dup, grad));
    EXPECT_TRUE(poisoned(ddown, grad));

    SavedActivations owned;
    plan.forward({empty, empty, {}}, owned);
    plan.backward({empty, empty,
                   kind == FfnKind::gated ? TensorView::matrix(dgate.data(), DType::f32, kN, kK) : TensorView{},
                   TensorView::matrix(dup.data(), DType::f32, kN, kK),
                   TensorView::matrix(ddown.data(), DType::f32, kN, kK)},
                  owned);
    EXPECT_EQ(owned.routed_rows(), 0);
  }
}

// Zero-element views address nothing, so they overlap nothing, wherever they point.
TEST(ArgsShapes, EmptyBatchInferenceOverlapsNothing) {
  Problem p = testing::make_problem({FfnKind::gated, 0, kK, kN, DType::f32, Pattern::uniform, 0.2, 256, seed(110)});
  InferencePlan plan(p.weights(), sparse());
  std::vector<int64_t> counters(2, -1);
  const TensorView at_gate = TensorView::matrix(p.gate.data(), DType::f32, 0, kK);
  plan.run({at_gate, at_gate, TensorView::vector(counters.data(), DType::i64, 2)});
  EXPECT_EQ(counters[0], 0);
  EXPECT_EQ(counters[1], 0);
  EXPECT_EQ(plan.last_run().rows, 0);
}

// A buffer at an address its element type does not divide: read as that type it would be
// undefined behaviour (UBSan reports it), so every op refuses it, naming the argument.
TensorView shifted(TensorView t, size_t bytes) {
  t.data = static_cast<char*>(t.data) + bytes;
  return t;
}

TEST(ArgsAlignment, MisalignedInferenceBuffersRaise) {
  Problem p = small(110);
  InferencePlan plan(p.weights(), sparse());
  std::vector<float> xs(kM * kK + 4), ys(kM * kK + 4);
  std::vector<int64_t> counters(3);
  std::vector<uint8_t> ws(plan.workspace_bytes(kM) + 64);
  const TensorView x = TensorView::matrix(xs.data(), DType::f32, kM, kK);
  const TensorView y = TensorView::matrix(ys.data(), DType::f32, kM, kK);
  const TensorView c = TensorView::vector(counters.data(), DType::i64, 2);
  expect_named_error([&] { plan.run({shifted(x, 1), y, c}); }, "x", "aligned to 4 bytes");
  expect_named_error([&] { plan.run({x, shifted(y, 2), c}); }, "y", "aligned to 4 bytes");
  expect_named_error([&] { plan.run({x, y, shifted(c, 4)}); }, "counters", "aligned to 8 bytes");
  EXPECT_FALSE(plan.can_run({shifted(x, 1), y, c}).ok);
  expect_named_error([&] { plan.run({x, y, c}, nullptr, ws.data() + 4, ws.size() - 4); }, "workspace",
                     "aligned to 16 bytes");
  plan.run({x, y, c}, nullptr, ws.data() + 16, ws.size() - 16);
  Problem q = small(111, DType::bf16);
  FfnWeights w = q.weights();
  w.up = shifted(w.up, 1);
  expect_named_error([&] { InferencePlan bad(w); }, "up weight", "aligned to 2 bytes");
}

TEST(ArgsAlignment, MisalignedTrainingBuffersRaise) {
  Problem p = small(112), dy = small(113);
  TrainingPlan plan(p.weights());
  SavedBuffer saved(plan, kM);
  std::vector<float> ys(kM * kK + 1), stats(3), coef(2, 0.5f);
  std::vector<uint8_t> ws(64);
  const TensorView y = TensorView::matrix(ys.data(), DType::f32, kM, kK);
  const TensorView st = TensorView::vector(stats.data(), DType::f32, 2);
  expect_named_error([&] { plan.forward({p.x_view(), shifted(y, 2), st}, saved.view); }, "y", "aligned");
  expect_named_error([&] { plan.forward({p.x_view(), y, shifted(st, 1)}, saved.view); }, "stats", "aligned");
  TensorView wsv = TensorView::vector(ws.data() + 8, DType::u8, 32);
  expect_named_error([&] { plan.forward({p.x_view(), y, st, wsv}, saved.view); }, "workspace", "aligned");
  TwellView odd = saved.view;
  odd.row_slot = reinterpret_cast<int32_t*>(reinterpret_cast<char*>(odd.row_slot) + 2);
  expect_named_error([&] { plan.forward({p.x_view(), y, st}, odd); }, "saved row_slot", "aligned to 4 bytes");
  plan.forward({p.x_view(), y, st}, saved.view);
  Grads g;
  TrainingBackwardArgs b = g.args(dy);
  b.dy = shifted(b.dy, 3);
  expect_named_error([&] { plan.backward(b, p.x_view(), saved.view); }, "dy", "aligned");
  b = g.args(dy);
  b.l1_coef = shifted(TensorView::vector(coef.data(), DType::f32, 1), 2);
  expect_named_error([&] { plan.backward(b, p.x_view(), saved.view); }, "l1_coef", "aligned");
  plan.backward(g.args(dy), p.x_view(), saved.view);
}

}  // namespace
}  // namespace twell::test
