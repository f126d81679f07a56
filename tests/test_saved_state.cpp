// The saved training state is untrusted input to backward: a buffer that forward never wrote, one
// of another plan, or one whose bytes were corrupted must give a twell::Error, never an
// out-of-bounds access and never silently wrong gradients. CPU: backward raises at once. CUDA: the
// check runs on the device (no host synchronisation); backward's kernels see an emptied index and
// the plan raises at its next call. scripts/gpu-check runs the CUDA cases under memcheck.
#include <functional>
#include <optional>
#include <random>
#include <string>

#include "common.hpp"

#ifdef TWELL_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda_util.hpp"
#endif

namespace twell::test {
namespace {

// One way to spoil a saved buffer that forward wrote (bytes: the whole single-buffer form, v: a
// host view of it). Each keeps the buffer's size, so only the content can give it away.
struct Corruption {
  const char* name;
  std::function<void(std::vector<uint8_t>& bytes, const TwellView& v, std::mt19937_64& rng)> apply;
};

int64_t first_compact_row(const TwellView& v) {
  for (int64_t r = 0; r < v.shape.rows; ++r)
    if (v.row_slot[r] < 0) return r;
  return 0;
}

std::vector<Corruption> corruptions() {
  auto compact = [](const TwellView& v, auto&& f) {
    const int64_t r = first_compact_row(v);
    v.row_slot[r] = -1;
    f(r * v.shape.num_tiles());
  };
  return {
      {"all 0xff bytes", [](auto& b, auto&, auto&) { std::fill(b.begin(), b.end(), uint8_t(0xff)); }},
      {"all zero bytes (forward never ran)", [](auto& b, auto&, auto&) { std::fill(b.begin(), b.end(), 0); }},
      {"random bytes",
       [](auto& b, auto&, auto& rng) {
         for (auto& c : b) c = uint8_t(rng());
       }},
      {"random bytes under a valid header",
       [](auto& b, auto& v, auto& rng) {
         const auto* end = reinterpret_cast<const uint8_t*>(v.header);
         for (auto* c = b.data(); c < end; ++c) *c = uint8_t(rng());
       }},
      {"count over capacity",
       [compact](auto&, auto& v, auto&) {
         compact(v, [&](int64_t i) { v.counts[i] = uint16_t(v.shape.capacity + 1); });
       }},
      {"count 65535",
       [compact](auto&, auto& v, auto&) { compact(v, [&](int64_t i) { v.counts[i] = 0xffff; }); }},
      {"column outside the tile",
       [compact](auto&, auto& v, auto&) {
         compact(v, [&](int64_t i) {
           v.counts[i] = 1;
           v.cols[i * v.shape.capacity] = uint16_t(v.shape.tile);
         });
       }},
      {"column 65535",
       [compact](auto&, auto& v, auto&) {
         compact(v, [&](int64_t i) {
           v.counts[i] = 1;
           v.cols[i * v.shape.capacity] = 0xffff;
         });
       }},
      {"repeated column",
       [compact](auto&, auto& v, auto&) {
         compact(v, [&](int64_t i) {
           v.counts[i] = 2;
           v.cols[i * v.shape.capacity] = v.cols[i * v.shape.capacity + 1] = 3;
         });
       }},
      {"num_routed past M", [](auto&, auto& v, auto&) { *v.num_routed = int32_t(v.shape.rows + 5); }},
      {"negative num_routed", [](auto&, auto& v, auto&) { *v.num_routed = -1; }},
      {"routed row past M",
       [](auto&, auto& v, auto&) {
         if (*v.num_routed == 0) *v.num_routed = 1;
         v.routed_rows[0] = 1 << 30;
       }},
      {"row slot past the routed list", [](auto&, auto& v, auto&) { v.row_slot[0] = 12345; }},
      {"row slot -7", [](auto&, auto& v, auto&) { v.row_slot[0] = -7; }},
      {"another plan's tag", [](auto&, auto& v, auto&) { v.header->owner ^= 1; }},
      {"unfinished write", [](auto&, auto& v, auto&) { v.header->written = 0; }},
  };
}

ProblemSpec spec_for(DType dt, uint64_t salt) {
  // Heavy-tailed at tile 64, capacity 4: some rows are routed, most are compact.
  return {FfnKind::gated, 37, 64, 520, dt, Pattern::heavy_tailed, 0.05, 64, seed(salt)};
}

TrainingOptions options_for(Dispatch dispatch = Dispatch::automatic) {
  TrainingOptions o;
  o.tile = 64;
  o.capacity = 4;
  o.l1_coef = 0.01;
  o.dispatch = dispatch;
  return o;
}

// The CPU backend: every corruption raises a twell::Error from backward itself.
TEST(SavedState, CpuBackwardRejectsCorruptedBuffers) {
  Problem p = testing::make_problem(spec_for(DType::f32, 3001));
  const int64_t m = p.spec.m, k = p.spec.k, n = p.spec.n;
  TrainingPlan plan(p.weights(), options_for());
  const TwellShape shape = plan.saved_shape(m);
  const size_t mk = size_t(m * k), nk = size_t(n * k);
  std::vector<float> y(mk), dy(mk, 0.5f), dx(mk), dg(nk), du(nk), dd(nk);
  const TrainingBackwardArgs back{TensorView::matrix(dy.data(), DType::f32, m, k),
                                  TensorView::matrix(dx.data(), DType::f32, m, k),
                                  TensorView::matrix(dg.data(), DType::f32, n, k),
                                  TensorView::matrix(du.data(), DType::f32, n, k),
                                  TensorView::matrix(dd.data(), DType::f32, n, k)};
  std::mt19937_64 rng(seed(3002));
  for (const Corruption& c : corruptions()) {
    std::vector<uint8_t> bytes(shape.bytes(DType::f32));
    const TwellView v = make_twell_view(bytes.data(), shape, DType::f32, Device::cpu());
    plan.forward({p.x_view(), TensorView::matrix(y.data(), DType::f32, m, k)}, v);
    plan.backward(back, p.x_view(), v);  // the untouched state is accepted
    c.apply(bytes, v, rng);
    try {
      plan.backward(back, p.x_view(), v);
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "saved") << c.name << ": " << e.what();
    }
  }
}

// Another plan's state of the same size (the same N, tile and capacity, another K): its header's
// tag gives it away, though every index in it is valid.
TEST(SavedState, CpuBackwardRejectsAnotherPlansState) {
  Problem a = testing::make_problem(spec_for(DType::f32, 3003));
  ProblemSpec wider = spec_for(DType::f32, 3004);
  wider.k = 72;
  Problem b = testing::make_problem(wider);
  TrainingPlan writer(a.weights(), options_for()), reader(b.weights(), options_for());
  const int64_t m = a.spec.m, n = a.spec.n;
  const TwellShape shape = writer.saved_shape(m);
  ASSERT_EQ(shape.bytes(DType::f32), reader.saved_shape(m).bytes(DType::f32));
  std::vector<uint8_t> bytes(shape.bytes(DType::f32));
  const TwellView v = make_twell_view(bytes.data(), shape, DType::f32, Device::cpu());
  std::vector<float> y(size_t(m * a.spec.k));
  writer.forward({a.x_view(), TensorView::matrix(y.data(), DType::f32, m, a.spec.k)}, v);
  const int64_t k = wider.k;
  std::vector<float> dy(size_t(m * k), 0.5f), dx(dy.size()), dg(size_t(n * k)), du(dg.size()), dd(dg.size());
  try {
    reader.backward({TensorView::matrix(dy.data(), DType::f32, m, k), TensorView::matrix(dx.data(), DType::f32, m, k),
                     TensorView::matrix(dg.data(), DType::f32, n, k), TensorView::matrix(du.data(), DType::f32, n, k),
                     TensorView::matrix(dd.data(), DType::f32, n, k)},
                    b.x_view(), v);
    ADD_FAILURE() << "another plan's state was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "saved") << e.what();
    EXPECT_NE(std::string(e.what()).find("header owner"), std::string::npos) << e.what();
  }
}

// One CPU step's buffers for spec_for's problem: forward with `writer`, backward with `reader`.
// Returns the backward's error, or nothing when it accepted the state.
std::optional<Error> cross_plan_step(Problem& p, TrainingPlan& writer, TrainingPlan& reader) {
  const int64_t m = p.spec.m, k = p.spec.k, n = p.spec.n;
  const TwellShape shape = writer.saved_shape(m);
  std::vector<uint8_t> bytes(shape.bytes(DType::f32));
  const TwellView v = make_twell_view(bytes.data(), shape, DType::f32, Device::cpu());
  std::vector<float> y(size_t(m * k)), dy(y.size(), 0.5f), dx(y.size()), dg(size_t(n * k)), du(dg.size()),
      dd(dg.size());
  writer.forward({p.x_view(), TensorView::matrix(y.data(), DType::f32, m, k)}, v);
  try {
    reader.backward({TensorView::matrix(dy.data(), DType::f32, m, k), TensorView::matrix(dx.data(), DType::f32, m, k),
                     TensorView::matrix(dg.data(), DType::f32, n, k), TensorView::matrix(du.data(), DType::f32, n, k),
                     TensorView::matrix(dd.data(), DType::f32, n, k)},
                    p.x_view(), v);
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

// Two plans of one shape, options and even weights: each refuses the other's state (the owner tag
// names the plan), and accepts its own.
TEST(SavedState, CpuBackwardRejectsAnotherPlanOfTheSameShape) {
  Problem p = testing::make_problem(spec_for(DType::f32, 3006));
  TrainingPlan first(p.weights(), options_for()), second(p.weights(), options_for());
  for (auto [w, r] : {std::pair{&first, &second}, {&second, &first}}) {
    const std::optional<Error> e = cross_plan_step(p, *w, *r);
    ASSERT_TRUE(e.has_value()) << "another plan's state was accepted";
    EXPECT_EQ(e->argument(), "saved") << e->what();
    EXPECT_NE(std::string(e->what()).find("header owner"), std::string::npos) << e->what();
  }
  EXPECT_FALSE(cross_plan_step(p, first, first).has_value());
  TrainingPlan moved(std::move(second));  // a moved plan is the same plan
  EXPECT_FALSE(cross_plan_step(p, moved, moved).has_value());
  EXPECT_TRUE(cross_plan_step(p, first, moved).has_value());
}

// Plans made with one state_tag (a cache that may remake a layer's plan between its forward and
// backward) accept each other's states; another tag, or the default, does not.
TEST(SavedState, PlansOfOneStateTagShareStates) {
  Problem p = testing::make_problem(spec_for(DType::f32, 3007));
  TrainingOptions tagged = options_for();
  tagged.state_tag = 42;
  TrainingPlan a(p.weights(), tagged), b(p.weights(), tagged), untagged(p.weights(), options_for());
  EXPECT_FALSE(cross_plan_step(p, a, b).has_value());
  EXPECT_FALSE(cross_plan_step(p, b, a).has_value());
  EXPECT_TRUE(cross_plan_step(p, a, untagged).has_value());
  EXPECT_TRUE(cross_plan_step(p, untagged, a).has_value());
  tagged.state_tag = 43;
  TrainingPlan other_tag(p.weights(), tagged);
  EXPECT_TRUE(cross_plan_step(p, a, other_tag).has_value());
}

// The plan-allocated state (SavedActivations) of one plan is refused by another.
TEST(SavedState, CpuBackwardRejectsAnotherPlansSavedActivations) {
  Problem p = testing::make_problem(spec_for(DType::f32, 3008));
  const int64_t m = p.spec.m, k = p.spec.k, n = p.spec.n;
  TrainingPlan writer(p.weights(), options_for()), reader(p.weights(), options_for());
  std::vector<float> y(size_t(m * k)), dy(y.size(), 0.5f), dx(y.size()), dg(size_t(n * k)), du(dg.size()),
      dd(dg.size());
  SavedActivations saved;
  writer.forward({p.x_view(), TensorView::matrix(y.data(), DType::f32, m, k)}, saved);
  const TrainingBackwardArgs back{TensorView::matrix(dy.data(), DType::f32, m, k),
                                  TensorView::matrix(dx.data(), DType::f32, m, k),
                                  TensorView::matrix(dg.data(), DType::f32, n, k),
                                  TensorView::matrix(du.data(), DType::f32, n, k),
                                  TensorView::matrix(dd.data(), DType::f32, n, k)};
  expect_named_error([&] { reader.backward(back, saved); }, "saved", "header owner");
  writer.backward(back, saved);
}

#ifndef TWELL_WITH_CUDA
TEST(SavedState, CudaDeviceCheck) { GTEST_SKIP() << "built without CUDA"; }
#else

// A device step of spec_for's problem with a caller-owned saved buffer.
struct DeviceState {
  Problem p;
  DeviceBuffer x, w, y, dy, dx, grads, saved;
  FfnWeights weights;
  std::unique_ptr<TrainingPlan> plan;
  TwellShape shape;

  DeviceState(DType dt, Dispatch dispatch, uint64_t salt) : p(testing::make_problem(spec_for(dt, salt))) {
    const int64_t m = p.spec.m, k = p.spec.k, n = p.spec.n;
    weights = device_weights(dt, n, k, w);
    for (auto [view, host] : {std::pair{&weights.gate, &p.gate}, {&weights.up, &p.up}, {&weights.down, &p.down}})
      cuda_ok(cudaMemcpy(view->data, host->data(), host->size(), cudaMemcpyHostToDevice), "weights");
    x = DeviceBuffer(p.x);
    y = DeviceBuffer(p.x.size());
    dy = DeviceBuffer(p.x);  // any bf16 values will do as an upstream gradient
    dx = DeviceBuffer(p.x.size());
    grads = DeviceBuffer(size_t(3 * n * k) * sizeof(float));
    plan = std::make_unique<TrainingPlan>(weights, options_for(dispatch));
    shape = plan->saved_shape(m);
    saved = DeviceBuffer(shape.bytes(dt));
  }
  TensorView mat(const DeviceBuffer& b, int64_t rows, int64_t cols, DType dt, size_t offset = 0) const {
    return TensorView::matrix(static_cast<char*>(b.get()) + offset, dt, rows, cols, Device::cuda(0));
  }
  TwellView view() const { return make_twell_view(saved.get(), shape, p.spec.dtype, Device::cuda(0)); }
  void forward() {
    plan->forward({mat(x, p.spec.m, p.spec.k, p.spec.dtype), mat(y, p.spec.m, p.spec.k, p.spec.dtype)}, view());
  }
  void backward() {
    const int64_t m = p.spec.m, k = p.spec.k, n = p.spec.n;
    const size_t g = size_t(n * k) * sizeof(float);
    const DType dt = p.spec.dtype;
    plan->backward({mat(dy, m, k, dt), mat(dx, m, k, dt), mat(grads, n, k, DType::f32),
                    mat(grads, n, k, DType::f32, g), mat(grads, n, k, DType::f32, 2 * g)},
                   mat(x, m, k, dt), view());
  }
};

void synchronize() { cuda_ok(cudaDeviceSynchronize(), "device synchronisation"); }

// Every corruption, in both saved forms: backward enqueues without an error and without a fault
// (memcheck in gpu-check), the next call raises an Error naming "saved" once, and a fresh step
// afterwards is accepted.
TEST(SavedState, CudaDeviceCheckRaisesAtTheNextCall) {
  TWELL_REQUIRE_DEVICE();
  std::mt19937_64 rng(seed(3004));
  for (Dispatch form : {Dispatch::force_sparse, Dispatch::force_dense}) {
    DeviceState d(DType::bf16, form, 3005);
    d.forward();
    d.backward();
    synchronize();
    EXPECT_NO_THROW(d.plan->saved_shape(d.p.spec.m)) << "a valid state was reported";
    for (const Corruption& c : corruptions()) {
      const std::string what = std::string(c.name) + (form == Dispatch::force_dense ? " (dense form)" : "");
      d.forward();
      std::vector<uint8_t> bytes = d.saved.download();
      const TwellView host = make_twell_view(bytes.data(), d.shape, d.p.spec.dtype, Device::cpu());
      c.apply(bytes, host, rng);
      d.saved.upload(bytes);
      d.backward();
      synchronize();
      expect_error([&] { d.plan->saved_shape(d.p.spec.m); }, "saved");
      EXPECT_NO_THROW(d.plan->saved_shape(d.p.spec.m)) << what << ": the fault was raised twice";
      d.forward();
      d.backward();
      synchronize();
      EXPECT_NO_THROW(d.plan->saved_shape(d.p.spec.m)) << what << ": a fresh step after it was reported";
    }
  }
}

// Another plan of the same shape, options and weights: its backward's device check refuses the
// state (the header's owner word) and the plan raises at its next call; its own steps run after.
TEST(SavedState, CudaBackwardRejectsAnotherPlanOfTheSameShape) {
  TWELL_REQUIRE_DEVICE();
  for (Dispatch form : {Dispatch::force_sparse, Dispatch::force_dense}) {
    DeviceState d(DType::bf16, form, 3009);
    TrainingPlan other(d.weights, options_for(form));
    d.forward();
    std::swap(*d.plan, other);  // backward on the other plan
    d.backward();
    synchronize();
    expect_error([&] { d.plan->saved_shape(d.p.spec.m); }, "saved");
    d.forward();
    d.backward();
    synchronize();
    EXPECT_NO_THROW(d.plan->saved_shape(d.p.spec.m)) << "its own state";
  }
}

#endif

}  // namespace
}  // namespace twell::test
