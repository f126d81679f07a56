// NaN and Inf semantics: every path (sparse, routed, dense; CPU and CUDA; inference, training forward
// and backward; gated and plain) gives NaN where the dense computation does, the same infinities,
// and the oracle's values elsewhere. The oracle is the fp64 dense one with torch's semantics:
// relu(NaN) = NaN, h = relu(g) * u and du = dh * relu(g) as products (0 * Inf = NaN), the ReLU
// derivative a select (0 where g <= 0, whatever dh is), sign(NaN) = 0 in the L1 term.
// Faults: a NaN or an Inf in one row of x, a NaN in one row of the first weight (the gate weight,
// or the up weight of a plain FFN), a NaN in dy (backward) at an ordinary row, at a row with no
// active neuron and wherever else it lands. Outputs are poisoned with a finite pattern, so an
// unwritten element cannot pass for an expected NaN.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common.hpp"

#ifdef TWELL_WITH_CUDA
#include "cuda_util.hpp"
#endif

namespace twell::test {
namespace {

constexpr int64_t kRows = 48, kHidden = 64, kNeurons = 296;  // the CPU shapes
constexpr int32_t kTile = 64;
constexpr int32_t kCapacity = 8;  // ordinary rows compact, dense rows routed
constexpr double kL1Coef = 0.05;
constexpr double kDensity = 0.05;
constexpr int64_t kFaultColumn = 5;       // the column of x, of the weight row and of dy hit
constexpr uint8_t kFinitePoison = 0x7b;   // 0x7b7b7b7b (fp32) and 0x7b7b (16-bit): about 1.3e36
constexpr float kNegativeWeight = 1e-2f;  // x_inf_inactive: no first-weight entry of the column is 0
// The finite part of a 16-bit CUDA gradient: g, u, h, dh, dg and du are rounded to the dtype on the
// way (test_cuda_training.cpp emulates it exactly; here a bound that still catches a wrong value).
constexpr double kDeviceGradFloor = 3e-2;

// x_inf_inactive: +Inf in x where every first-weight entry of its column is negative, so every gate
// of the row is -Inf: nothing is active, yet the dense h = 0 * u = NaN (gated) and 0 * Inf = NaN
// reaches the first weight's gradient (both kinds).
enum class Fault : uint8_t { x_nan, x_inf, x_inf_inactive, weight_nan, dy_nan };

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::x_nan:
      return "x_nan";
    case Fault::x_inf:
      return "x_inf";
    case Fault::x_inf_inactive:
      return "x_inf_inactive";
    case Fault::weight_nan:
      return "weight_nan";
    case Fault::dy_nan:
      return "dy_nan";
  }
  return "?";
}

// Whether the fault makes some of y non-finite (a plain layer's y does not see x_inf_inactive:
// relu(-Inf) = 0 there, with no u to multiply).
bool reaches_y(FfnKind kind, Fault f) { return !(kind == FfnKind::plain && f == Fault::x_inf_inactive); }

void poison_finite(std::vector<uint8_t>& b) { std::fill(b.begin(), b.end(), uint8_t(kFinitePoison)); }

// The problem with its fault: x, weights and an independent random dy (host, in the dtype).
struct Faulty {
  Problem p;
  std::vector<uint8_t> dy;
  ref::Weights w_clean;
  ref::Matrix x_clean, dy_clean;
  int64_t row = -1;       // the ordinary row hit (x or dy)
  int64_t zero_row = -1;  // dy_nan: a row made inactive (x row zeroed), with a NaN in dy
};

// The first row with some active gates that the generator made neither zero, dense nor hot.
int64_t ordinary_row(const ref::Forward& f, const std::vector<int64_t>& special) {
  for (int64_t r = 0; r < f.gate_pre.rows; ++r) {
    if (std::find(special.begin(), special.end(), r) != special.end()) continue;
    for (int64_t n = 0; n < f.gate_pre.cols; ++n)
      if (ref::relu_active(f.gate_pre.at(r, n))) return r;
  }
  return 0;
}

Faulty make_faulty(FfnKind kind, DType dt, Fault fault, int64_t m, int64_t k, int64_t n, uint64_t salt) {
  Faulty d;
  d.p = testing::make_problem({kind, m, k, n, dt, Pattern::edge_rows, kDensity, kTile, seed(salt)});
  d.dy = testing::make_problem({kind, m, k, 1, dt, Pattern::uniform, 0.5, kTile, seed(salt) + 1}).x;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<uint8_t>& first = kind == FfnKind::gated ? d.p.gate : d.p.up;
  if (fault == Fault::dy_nan) {  // a row of x zeroed: no gate active there
    d.zero_row = m - 1;
    for (int64_t c = 0; c < k; ++c) store_float(d.p.x.data(), dt, d.zero_row * k + c, 0.0f);
  }
  if (fault == Fault::x_inf_inactive)
    for (int64_t r = 0; r < n; ++r) {
      const int64_t at = r * k + kFaultColumn;
      store_float(first.data(), dt, at, -std::fabs(load_float(first.data(), dt, at)) - kNegativeWeight);
    }
  d.w_clean = ref::from_weights(d.p.weights());
  d.x_clean = ref::from_view(d.p.x_view());
  d.dy_clean = ref::from_view(TensorView::matrix(d.dy.data(), dt, m, k));
  d.row = ordinary_row(ref::ffn_forward(d.w_clean, d.x_clean), d.p.special_rows);
  switch (fault) {
    case Fault::x_nan:
      store_float(d.p.x.data(), dt, d.row * k + kFaultColumn, nan);
      break;
    case Fault::x_inf:
    case Fault::x_inf_inactive:
      store_float(d.p.x.data(), dt, d.row * k + kFaultColumn, inf);
      break;
    case Fault::weight_nan:
      store_float(first.data(), dt, (n / 3) * k + kFaultColumn, nan);
      break;
    case Fault::dy_nan:
      store_float(d.dy.data(), dt, d.row * k + kFaultColumn, nan);
      store_float(d.dy.data(), dt, d.zero_row * k + kFaultColumn + 1, nan);
      for (int64_t r : d.p.special_rows) store_float(d.dy.data(), dt, r * k + kFaultColumn + 2, nan);
      break;
  }
  return d;
}

// got against the oracle: NaN exactly where it has NaN, its infinities, and the finite elements
// within tol (relative, over them). Returns how many elements of the oracle are NaN or infinite.
int64_t expect_dense_nan(const ref::Matrix& got, const ref::Matrix& want, double tol,
                         const std::string& what) {
  int64_t nonfinite = 0, wrong = 0, first = -1;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.v.size(); ++i) {
    const double a = got.v[i], b = want.v[i];
    bool ok = true;
    if (std::isnan(b)) {
      ok = std::isnan(a);
    } else if (std::isinf(b)) {
      ok = a == b;
    } else if (!std::isfinite(a)) {
      ok = false;
    } else {
      num += (a - b) * (a - b);
      den += b * b;
    }
    nonfinite += !std::isfinite(b);
    if (!ok && wrong++ == 0) first = int64_t(i);
  }
  EXPECT_EQ(wrong, 0) << what << ": " << wrong << " elements of the wrong kind; first at ("
                      << first / want.cols << ", " << first % want.cols << "): got " << got.v[size_t(first)]
                      << ", dense gives " << want.v[size_t(first)];
  const double error = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  EXPECT_LE(error, tol) << what << ": finite part";
  return nonfinite;
}

// Tolerance of an output stored in dtype t: 2x the error of rounding the oracle to t, plus a floor.
double stored_tol(const ref::Matrix& r, DType t) {
  ref::Matrix rounded = r;
  for (double& v : rounded.v) v = round_to(t, float(v));
  return 2 * ref::rel_error(rounded, r) + (t == DType::f32 ? 2e-5 : 1e-3);
}

ref::Matrix host_matrix(const std::vector<uint8_t>& b, DType t, int64_t r, int64_t c) {
  return ref::from_view(TensorView::matrix(const_cast<uint8_t*>(b.data()), t, r, c));
}

// ---------------------------------------------------------------------------------------------
// Checks shared by both backends.

void check_inference(Faulty& d, const std::vector<uint8_t>& y, const std::string& what) {
  const ProblemSpec& s = d.p.spec;
  const ref::Forward clean = ref::ffn_forward(d.w_clean, d.x_clean);
  const ref::Forward f = ref::ffn_forward(ref::from_weights(d.p.weights()), ref::from_view(d.p.x_view()));
  const double tol = tolerance(d.w_clean, d.x_clean, clean, s.dtype);
  EXPECT_GT(expect_dense_nan(host_matrix(y, s.dtype, s.m, s.k), f.y, tol, what + " y"), 0) << what;
}

struct TrainingOutputs {
  std::vector<uint8_t> y, dx;
  std::vector<uint8_t> dfirst, dup, ddown, stats;  // fp32; dup empty for plain
};

void check_training(Faulty& d, const TrainingOutputs& o, bool device, const std::string& what) {
  const ProblemSpec& s = d.p.spec;
  const bool gated = s.kind == FfnKind::gated;
  const ref::Weights w = ref::from_weights(d.p.weights());
  const ref::Matrix x = ref::from_view(d.p.x_view());
  const ref::Matrix dy = host_matrix(d.dy, s.dtype, s.m, s.k);
  const ref::Forward f = ref::ffn_forward(w, x);
  const ref::Grads g = ref::ffn_backward(w, x, dy, kL1Coef);
  const ref::Forward fc = ref::ffn_forward(d.w_clean, d.x_clean);
  const ref::Grads gc = ref::ffn_backward(d.w_clean, d.x_clean, d.dy_clean, kL1Coef);
  const testing::Fp32Slack slack = testing::fp32_slack(d.w_clean, d.x_clean, d.dy_clean, fc, kL1Coef);
  const bool coarse = device && s.dtype != DType::f32;
  auto grad_tol = [&](const ref::Matrix& clean, DType t, double abs_slack) {
    const double rel = std::max(stored_tol(clean, t), coarse ? kDeviceGradFloor : 0.0);
    return testing::with_slack(rel, abs_slack, clean);
  };
  int64_t nonfinite = expect_dense_nan(host_matrix(o.y, s.dtype, s.m, s.k), f.y,
                                       tolerance(d.w_clean, d.x_clean, fc, s.dtype), what + " y");
  nonfinite += expect_dense_nan(host_matrix(o.dx, s.dtype, s.m, s.k), g.dx,
                                grad_tol(gc.dx, s.dtype, slack.dx), what + " dx");
  const ref::Matrix& first_ref = gated ? g.dgate : g.dup;
  const ref::Matrix& first_clean = gated ? gc.dgate : gc.dup;
  nonfinite += expect_dense_nan(host_matrix(o.dfirst, DType::f32, s.n, s.k), first_ref,
                                grad_tol(first_clean, DType::f32, slack.dfirst), what + " d(first weight)");
  if (gated)
    nonfinite += expect_dense_nan(host_matrix(o.dup, DType::f32, s.n, s.k), g.dup,
                                  grad_tol(gc.dup, DType::f32, slack.dsecond), what + " dWu");
  nonfinite += expect_dense_nan(host_matrix(o.ddown, DType::f32, s.n, s.k), g.ddown,
                                grad_tol(gc.ddown, DType::f32, slack.ddown), what + " dWd");
  EXPECT_GT(nonfinite, 0) << what << ": the fault reaches nothing";
  float stats[2];
  std::memcpy(stats, o.stats.data(), sizeof stats);
  const double l0 = ref::l0_per_token(f), l1 = ref::l1_per_token(f);
  EXPECT_NEAR(stats[0], l0, 1.0 / double(s.m) + 1e-3 * l0) << what << " L0";
  if (std::isfinite(l1))
    EXPECT_NEAR(stats[1], l1, 2e-2 * (1 + l1)) << what << " L1";
  else
    EXPECT_TRUE(std::isnan(stats[1]) || stats[1] == float(l1)) << what << " L1 " << stats[1];
}

// ---------------------------------------------------------------------------------------------
// CPU.

struct CpuCase {
  FfnKind kind;
  DType dtype;
  Fault fault;
  Dispatch dispatch;
  int32_t capacity;
  int64_t m;
};

std::string cpu_name(const ::testing::TestParamInfo<CpuCase>& info) {
  const CpuCase& c = info.param;
  const char* d = c.dispatch == Dispatch::automatic      ? "auto"
                  : c.dispatch == Dispatch::force_sparse ? "sparse"
                                                         : "dense";
  return std::string(ffn_kind_name(c.kind)) + "_" + dtype_name(c.dtype) + "_" + fault_name(c.fault) + "_" +
         d + "_cap" + std::to_string(c.capacity) + "_M" + std::to_string(c.m);
}

class NanCpuInference : public ::testing::TestWithParam<CpuCase> {};

TEST_P(NanCpuInference, MatchesDense) {
  const CpuCase& c = GetParam();
  Faulty d = make_faulty(c.kind, c.dtype, c.fault, c.m, kHidden, kNeurons, 11 + uint64_t(c.fault));
  InferenceOptions o;
  o.tile = kTile;
  o.capacity = c.capacity;
  o.dispatch = c.dispatch;
  InferencePlan plan(d.p.weights(), o);
  std::vector<uint8_t> y(d.p.x.size());
  poison_finite(y);
  plan.run({d.p.x_view(), TensorView::matrix(y.data(), c.dtype, c.m, kHidden), {}});
  check_inference(d, y, cpu_name({c, 0}) + " " + d.p.spec.describe());
}

std::vector<CpuCase> cpu_inference_cases() {
  std::vector<CpuCase> out;
  for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
    for (DType dt : {DType::f32, DType::bf16})
      for (Fault f : {Fault::x_nan, Fault::x_inf, Fault::x_inf_inactive, Fault::weight_nan}) {
        if (!reaches_y(kind, f)) continue;
        out.push_back({kind, dt, f, Dispatch::force_sparse, kCapacity, kRows});
        out.push_back({kind, dt, f, Dispatch::force_sparse, kTile, kRows});  // nothing overflows
        out.push_back({kind, dt, f, Dispatch::force_dense, kCapacity, kRows});
        out.push_back({kind, dt, f, Dispatch::automatic, kCapacity, kRows});
        out.push_back({kind, dt, f, Dispatch::automatic, kCapacity, 7});  // M < 16: sparse
      }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Faults, NanCpuInference, ::testing::ValuesIn(cpu_inference_cases()), cpu_name);

class NanCpuTraining : public ::testing::TestWithParam<CpuCase> {};

TEST_P(NanCpuTraining, MatchesDense) {
  const CpuCase& c = GetParam();
  const bool gated = c.kind == FfnKind::gated;
  Faulty d = make_faulty(c.kind, c.dtype, c.fault, c.m, kHidden, kNeurons, 21 + uint64_t(c.fault));
  TrainingOptions o;
  o.tile = kTile;
  o.capacity = c.capacity;
  o.l1_coef = kL1Coef;
  TrainingPlan plan(d.p.weights(), o);
  const ProblemSpec& s = d.p.spec;
  const size_t grad = size_t(s.n * s.k) * sizeof(float);
  TrainingOutputs out{std::vector<uint8_t>(d.p.x.size()), std::vector<uint8_t>(d.p.x.size()),
                      std::vector<uint8_t>(grad),         std::vector<uint8_t>(gated ? grad : 0),
                      std::vector<uint8_t>(grad),         std::vector<uint8_t>(2 * sizeof(float))};
  for (auto* b : {&out.y, &out.dx, &out.dfirst, &out.dup, &out.ddown, &out.stats}) poison_finite(*b);
  auto mat = [](std::vector<uint8_t>& b, DType t, int64_t r, int64_t cols) {
    return TensorView::matrix(b.data(), t, r, cols);
  };
  SavedActivations saved;
  plan.forward(
      {d.p.x_view(), mat(out.y, s.dtype, s.m, s.k), TensorView::vector(out.stats.data(), DType::f32, 2)},
      saved);
  TrainingBackwardArgs b;
  b.dy = mat(d.dy, s.dtype, s.m, s.k);
  b.dx = mat(out.dx, s.dtype, s.m, s.k);
  if (gated) b.dgate = mat(out.dfirst, DType::f32, s.n, s.k);
  b.dup = mat(gated ? out.dup : out.dfirst, DType::f32, s.n, s.k);
  b.ddown = mat(out.ddown, DType::f32, s.n, s.k);
  plan.backward(b, saved);
  check_training(d, out, false, cpu_name({c, 0}) + " " + s.describe());
}

std::vector<CpuCase> cpu_training_cases() {
  std::vector<CpuCase> out;
  for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
    for (DType dt : {DType::f32, DType::bf16})
      for (Fault f : {Fault::x_nan, Fault::x_inf, Fault::x_inf_inactive, Fault::weight_nan, Fault::dy_nan})
        for (int32_t capacity : {kCapacity, kTile})
          out.push_back({kind, dt, f, Dispatch::force_sparse, capacity, kRows});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Faults, NanCpuTraining, ::testing::ValuesIn(cpu_training_cases()), cpu_name);

// The oracle itself: relu keeps NaN, 0 * Inf in h, and a zero coefficient against a NaN row of dy.
TEST(NanReference, DenseSemantics) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(std::isnan(ref::relu(nan)));
  EXPECT_EQ(ref::relu(-inf), 0.0);
  EXPECT_TRUE(ref::relu_active(nan));
  EXPECT_FALSE(ref::relu_active(-0.0));
  ref::Weights w;
  w.kind = FfnKind::gated;
  w.gate = ref::Matrix(2, 1);
  w.up = ref::Matrix(2, 1);
  w.down = ref::Matrix(2, 1);
  w.gate.v = {1.0, -1.0};  // neuron 1 inactive for x > 0
  w.up.v = {1.0, 1.0};
  w.down.v = {1.0, 1.0};
  ref::Matrix x(1, 1);
  x.v = {inf};  // g = {inf, -inf}, u = {inf, inf}: h = {inf, 0 * inf = NaN}
  EXPECT_TRUE(std::isnan(ref::ffn_forward(w, x).y.v[0]));
  x.v = {1.0};
  ref::Matrix dy(1, 1);
  dy.v = {nan};
  const ref::Grads g = ref::ffn_backward(w, x, dy, 0.0);
  EXPECT_TRUE(std::isnan(g.dup.v[1])) << "du = dh * relu(g) = NaN * 0 at the inactive neuron";
  EXPECT_EQ(g.dgate.v[1], 0.0) << "the ReLU derivative selects 0 at the inactive neuron";
  EXPECT_TRUE(std::isnan(g.ddown.v[1])) << "0 * NaN in h^T dy";
}

// ---------------------------------------------------------------------------------------------
// CUDA: the same faults on every device path (they skip without a device).

#ifndef TWELL_WITH_CUDA

TEST(NanCuda, Backend) { GTEST_SKIP() << "built without CUDA"; }

#else

struct CudaCase {
  FfnKind kind;
  DType dtype;
  Fault fault;
  Dispatch dispatch;  // training: force_sparse = the compact saved form, force_dense = the dense one
  GateKernel gate;
  int32_t tile, capacity;
  int64_t m, k, n;
};

std::string cuda_name(const ::testing::TestParamInfo<CudaCase>& info) {
  const CudaCase& c = info.param;
  const char* d = c.dispatch == Dispatch::automatic      ? "auto"
                  : c.dispatch == Dispatch::force_sparse ? "sparse"
                                                         : "dense";
  return std::string(ffn_kind_name(c.kind)) + "_" + dtype_name(c.dtype) + "_" + fault_name(c.fault) + "_" +
         d + (c.gate == GateKernel::portable ? "_portable" : "_auto") + "_tile" + std::to_string(c.tile) +
         "_cap" + std::to_string(c.capacity) + "_M" + std::to_string(c.m) + "_K" + std::to_string(c.k) +
         "_N" + std::to_string(c.n) + "_" + std::to_string(info.index);
}

// A host buffer on device 0.
struct OnDevice {
  DeviceBuffer x, gate, up, down;
  explicit OnDevice(const Problem& p) : x(p.x), up(p.up), down(p.down) {
    if (p.spec.kind == FfnKind::gated) gate = DeviceBuffer(p.gate);
  }
  FfnWeights weights(const ProblemSpec& s) const { return device_weights_of(s, gate, up, down); }
};

DeviceBuffer poisoned(size_t bytes) {
  std::vector<uint8_t> host(bytes);
  poison_finite(host);
  return DeviceBuffer(host);
}

class NanCudaInference : public ::testing::TestWithParam<CudaCase> {};

TEST_P(NanCudaInference, MatchesDense) {
  TWELL_REQUIRE_DEVICE();
  const CudaCase& c = GetParam();
  const int64_t m = c.m;
  Faulty d = make_faulty(c.kind, c.dtype, c.fault, m, c.k, c.n, 31 + uint64_t(c.fault));
  const ProblemSpec& s = d.p.spec;
  OnDevice dev(d.p);
  InferenceOptions o;
  o.tile = c.tile;
  o.capacity = c.capacity;
  o.dispatch = c.dispatch;
  o.gate = c.gate;
  InferencePlan plan(dev.weights(s), o);
  DeviceBuffer y = poisoned(d.p.x.size());
  plan.run({TensorView::matrix(dev.x.get(), s.dtype, m, s.k, Device::cuda(0)),
            TensorView::matrix(y.get(), s.dtype, m, s.k, Device::cuda(0)),
            {}});
  cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "inference");
  check_inference(d, y.download(), cuda_name({c, 0}) + " " + s.describe());
}

class NanCudaTraining : public ::testing::TestWithParam<CudaCase> {};

TEST_P(NanCudaTraining, MatchesDense) {
  TWELL_REQUIRE_DEVICE();
  const CudaCase& c = GetParam();
  const bool gated = c.kind == FfnKind::gated;
  const int64_t m = c.m;
  Faulty d = make_faulty(c.kind, c.dtype, c.fault, m, c.k, c.n, 41 + uint64_t(c.fault));
  const ProblemSpec& s = d.p.spec;
  const Device cuda = Device::cuda(0);
  OnDevice dev(d.p);
  TrainingOptions o;
  o.tile = c.tile;
  o.capacity = c.capacity;
  o.l1_coef = kL1Coef;
  o.dispatch = c.dispatch;
  o.gate = c.gate;
  TrainingPlan plan(dev.weights(s), o);
  const size_t grad = size_t(s.n * s.k) * sizeof(float);
  DeviceBuffer dy(d.dy), y = poisoned(d.p.x.size()), dx = poisoned(d.p.x.size()), dfirst = poisoned(grad),
                         dup = poisoned(gated ? grad : 0), ddown = poisoned(grad),
                         stats = poisoned(2 * sizeof(float));
  auto mat = [&](const DeviceBuffer& b, DType t, int64_t r, int64_t cols) {
    return TensorView::matrix(b.get(), t, r, cols, cuda);
  };
  SavedActivations saved;
  plan.forward({mat(dev.x, s.dtype, m, s.k), mat(y, s.dtype, m, s.k),
                TensorView::vector(stats.get(), DType::f32, 2, cuda)},
               saved);
  TrainingBackwardArgs b;
  b.dy = mat(dy, s.dtype, m, s.k);
  b.dx = mat(dx, s.dtype, m, s.k);
  if (gated) b.dgate = mat(dfirst, DType::f32, s.n, s.k);
  b.dup = mat(gated ? dup : dfirst, DType::f32, s.n, s.k);
  b.ddown = mat(ddown, DType::f32, s.n, s.k);
  plan.backward(b, saved);
  cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "training step");
  const TrainingOutputs out{y.download(),   dx.download(),    dfirst.download(),
                            dup.download(), ddown.download(), stats.download()};
  check_training(d, out, true, cuda_name({c, 0}) + " " + s.describe());
}

// M = 97: past the decode path's rows (M <= 64, inference only: M = 3, 9 and 20 on the fused
// decode kernel, one, two and four token tiles; 33 on the two-kernel one). K = 256: the
// warp-per-row kernels (routed rows of moderate length read from G); K = 72: the CTA-per-row
// kernels (every routed row to the backup). Capacity = tile: no row overflows, so only the
// non-finite rule routes the faulty rows. The fused gate kernel runs on sm_90a devices only
// (GateKernel::automatic elsewhere is the portable pair).
std::vector<CudaCase> cuda_cases(bool training) {
  constexpr int64_t kM = 97, kN = 520;
  std::vector<CudaCase> out;
  for (FfnKind kind : {FfnKind::gated, FfnKind::plain})
    for (DType dt : {DType::bf16, DType::f16})
      for (Fault f : {Fault::x_nan, Fault::x_inf, Fault::x_inf_inactive, Fault::weight_nan, Fault::dy_nan}) {
        if (!training && (f == Fault::dy_nan || !reaches_y(kind, f))) continue;
        for (int64_t k : {int64_t(256), int64_t(72)}) {
          for (GateKernel gate : {GateKernel::automatic, GateKernel::portable})
            for (int32_t tile : {128, 64})
              out.push_back(
                  {kind, dt, f, Dispatch::force_sparse, gate, tile, tile == 64 ? 64 : 16, kM, k, kN});
          out.push_back({kind, dt, f, Dispatch::force_dense, GateKernel::automatic, 128, 16, kM, k, kN});
          if (training) continue;
          out.push_back({kind, dt, f, Dispatch::automatic, GateKernel::automatic, 128, 16, kM, k, kN});
          for (int64_t decode_m : {int64_t(3), int64_t(9), int64_t(20), int64_t(33)})
            out.push_back(
                {kind, dt, f, Dispatch::force_sparse, GateKernel::automatic, 128, 16, decode_m, k, kN});
        }
      }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Faults, NanCudaInference, ::testing::ValuesIn(cuda_cases(false)), cuda_name);
INSTANTIATE_TEST_SUITE_P(Faults, NanCudaTraining, ::testing::ValuesIn(cuda_cases(true)), cuda_name);

#endif

}  // namespace
}  // namespace twell::test
