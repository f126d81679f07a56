// The L1 coefficient's rule: the coefficient a user sets (TrainingOptions::l1_coef) must be finite
// and >= 0; the per-call l1_coef of backward is the upstream gradient of the L1 value and follows
// dense autograd: any sign, and a NaN or infinite one gives non-finite gradients exactly where the
// fp64 oracle (the dense computation) has them.
#include <limits>
#include <optional>

#include "common.hpp"

namespace twell::test {
namespace {

constexpr int64_t kRows = 16, kHidden = 64, kUnits = 128;
constexpr int32_t kTile = 64;
// Capacity = tile: no row is routed, so every row runs the compact (sparse) path, the one that
// skips inactive units.
constexpr int32_t kCapacity = kTile;
// Over 16 rows and 128 units this leaves units no row activates and, often, a row with no active
// unit.
constexpr double kDensity = 0.02;
constexpr int kSeedAttempts = 16;
// A finite byte pattern for outputs whose expected values include NaN (the usual NaN poison would
// pass an unwritten element as a correct NaN).
constexpr int kFinitePoison = 0x42;
constexpr int kNaNPoison = 0xff;  // the usual poison, for outputs expected finite
constexpr float kNegativeCoef = -0.7f;

struct Outputs {
  std::vector<uint8_t> dx;
  std::vector<float> dgate, dup, ddown;
};

// The problem, its random upstream gradient dy and the oracle's forward, from the first seed whose
// gate values are all clear of fp32 noise around zero (so the active set is not in doubt) and
// which has a unit no row activates and a row with no active unit.
struct L1Problem {
  Problem p;
  std::vector<uint8_t> dy;
  ref::Weights w;
  ref::Matrix x, dyr;
  ref::Forward f;
};

std::optional<L1Problem> make_l1_problem(FfnKind kind, DType dt, uint64_t salt) {
  for (int attempt = 0; attempt < kSeedAttempts; ++attempt) {
    const uint64_t s = seed(salt * kSeedAttempts + uint64_t(attempt));
    ProblemSpec spec{kind, kRows, kHidden, kUnits, dt, Pattern::uniform, kDensity, kTile, s};
    L1Problem st{testing::make_problem(spec), {}, {}, {}, {}, {}};
    const ProblemSpec dy_spec{kind, kRows, kHidden, 1, dt, Pattern::uniform, 0.5, kTile, s + 1};
    st.dy = testing::make_problem(dy_spec).x;  // an independent random [M, K]
    st.w = ref::from_weights(st.p.weights());
    st.x = ref::from_view(st.p.x_view());
    st.dyr = ref::from_view(TensorView::matrix(st.dy.data(), dt, kRows, kHidden));
    st.f = ref::ffn_forward(st.w, st.x);
    if (testing::fp32_slack(st.w, st.x, st.dyr, st.f, 0.0).entries != 0) continue;
    std::vector<bool> unit_used(size_t(kUnits), false);
    bool idle_row = false;
    for (int64_t r = 0; r < kRows; ++r) {
      bool any = false;
      for (int64_t c = 0; c < kUnits; ++c)
        if (st.f.gate_pre.at(r, c) > 0) any = unit_used[size_t(c)] = true;
      idle_row = idle_row || !any;
    }
    bool idle_unit = false;
    for (bool used : unit_used) idle_unit = idle_unit || !used;
    if (idle_row && idle_unit) return st;
  }
  return std::nullopt;
}

// Forward, then backward with the per-call l1_coef `coef` (a host float), outputs poisoned with
// `poison_byte` first.
Outputs run(L1Problem& st, FfnKind kind, DType dt, float coef, int poison_byte) {
  TrainingOptions opt;
  opt.tile = kTile;
  opt.capacity = kCapacity;
  TrainingPlan plan(st.p.weights(), opt);
  const bool gated = kind == FfnKind::gated;
  std::vector<uint8_t> y(size_t(kRows * kHidden) * dtype_size(dt));
  Outputs o{std::vector<uint8_t>(y.size()), std::vector<float>(size_t(kUnits * kHidden)), {}, {}};
  o.dup = o.ddown = o.dgate;
  std::memset(o.dx.data(), poison_byte, o.dx.size());
  for (auto* b : {&o.dgate, &o.dup, &o.ddown}) std::memset(b->data(), poison_byte, b->size() * 4);
  SavedActivations saved;
  plan.forward({st.p.x_view(), TensorView::matrix(y.data(), dt, kRows, kHidden)}, saved);
  EXPECT_EQ(saved.routed_rows(), 0) << "every row should take the compact path";
  TrainingBackwardArgs a{TensorView::matrix(st.dy.data(), dt, kRows, kHidden),
                         TensorView::matrix(o.dx.data(), dt, kRows, kHidden),
                         gated ? TensorView::matrix(o.dgate.data(), DType::f32, kUnits, kHidden)
                               : TensorView{},
                         TensorView::matrix(o.dup.data(), DType::f32, kUnits, kHidden),
                         TensorView::matrix(o.ddown.data(), DType::f32, kUnits, kHidden)};
  a.l1_coef = TensorView::vector(&coef, DType::f32, 1);
  plan.backward(a, saved);
  return o;
}

ref::Matrix f32_matrix(std::vector<float>& v) {
  return ref::from_view(TensorView::matrix(v.data(), DType::f32, kUnits, kHidden));
}

// Elements whose class differs from the oracle's: finite or not, and (when `nan_exact`) NaN or not.
int64_t mask_mismatches(const ref::Matrix& got, const ref::Matrix& want, bool nan_exact) {
  int64_t bad = 0;
  for (size_t i = 0; i < want.v.size(); ++i) {
    const bool finite_differs = std::isfinite(got.v[i]) != std::isfinite(want.v[i]);
    const bool nan_differs = nan_exact && std::isnan(got.v[i]) != std::isnan(want.v[i]);
    bad += finite_differs || nan_differs;
  }
  return bad;
}

// The relative error over the elements the oracle has finite.
double finite_error(ref::Matrix got, ref::Matrix want) {
  for (size_t i = 0; i < want.v.size(); ++i)
    if (!std::isfinite(want.v[i])) got.v[i] = want.v[i] = 0.0;
  return ref::rel_error(got, want);
}

double tolerance_of(DType t) { return t == DType::f32 ? 2e-5 : 1e-2; }

struct NonFiniteCase {
  FfnKind kind;
  DType dtype;
  float coef;
};

class NonFiniteL1Gradient : public ::testing::TestWithParam<NonFiniteCase> {};

TEST_P(NonFiniteL1Gradient, NonFiniteWhereDenseAutogradIs) {
  const NonFiniteCase& c = GetParam();
  const bool gated = c.kind == FfnKind::gated;
  const uint64_t salt = uint64_t(gated) * 2 + (c.dtype == DType::f32);
  std::optional<L1Problem> made = make_l1_problem(c.kind, c.dtype, salt);
  ASSERT_TRUE(made) << "no seed in " << kSeedAttempts << " gave an unambiguous problem";
  L1Problem& st = *made;
  Outputs o = run(st, c.kind, c.dtype, c.coef, kFinitePoison);
  const ref::Grads want = ref::ffn_backward(st.w, st.x, st.dyr, double(c.coef));
  const ref::Matrix dx = ref::from_view(TensorView::matrix(o.dx.data(), c.dtype, kRows, kHidden));
  // NaN against infinity depends only on which terms are infinite (not on summation order) except
  // where an infinity-only sum is NaN-filled: exact for a NaN coefficient, finiteness for inf.
  const bool nan_exact = std::isnan(c.coef);
  const std::string what = std::string(ffn_kind_name(c.kind)) + " " + dtype_name(c.dtype) +
                           " l1_coef " + std::to_string(c.coef) + " seed " +
                           std::to_string(st.p.spec.seed);
  EXPECT_EQ(mask_mismatches(dx, want.dx, nan_exact), 0) << "dx " << what;
  EXPECT_EQ(mask_mismatches(f32_matrix(o.dup), want.dup, nan_exact), 0) << "dup " << what;
  EXPECT_EQ(mask_mismatches(f32_matrix(o.ddown), want.ddown, nan_exact), 0) << "ddown " << what;
  EXPECT_LE(finite_error(f32_matrix(o.ddown), want.ddown), tolerance_of(DType::f32)) << what;
  if (gated) {
    EXPECT_EQ(mask_mismatches(f32_matrix(o.dgate), want.dgate, nan_exact), 0) << "dgate " << what;
    EXPECT_LE(finite_error(f32_matrix(o.dgate), want.dgate), tolerance_of(DType::f32)) << what;
  } else {
    EXPECT_LE(finite_error(f32_matrix(o.dup), want.dup), tolerance_of(DType::f32)) << what;
    EXPECT_LE(finite_error(dx, want.dx), tolerance_of(c.dtype)) << what;
  }
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

INSTANTIATE_TEST_SUITE_P(
    Cpu, NonFiniteL1Gradient,
    ::testing::Values(NonFiniteCase{FfnKind::gated, DType::f32, kNaN},
                      NonFiniteCase{FfnKind::gated, DType::bf16, kNaN},
                      NonFiniteCase{FfnKind::gated, DType::f32, kInf},
                      NonFiniteCase{FfnKind::gated, DType::f32, -kInf},
                      NonFiniteCase{FfnKind::plain, DType::f32, kNaN},
                      NonFiniteCase{FfnKind::plain, DType::bf16, kInf}),
    [](const ::testing::TestParamInfo<NonFiniteCase>& info) {
      const NonFiniteCase& c = info.param;
      const char* coef = std::isnan(c.coef) ? "nan" : c.coef > 0 ? "inf" : "minus_inf";
      return std::string(ffn_kind_name(c.kind)) + "_" + dtype_name(c.dtype) + "_" + coef;
    });

// A negative upstream gradient (a loss that subtracts the L1 term) is a gradient like any other.
TEST(L1Coef, NegativeUpstreamGradientIsExact) {
  for (FfnKind kind : {FfnKind::gated, FfnKind::plain}) {
    const bool gated = kind == FfnKind::gated;
    std::optional<L1Problem> made = make_l1_problem(kind, DType::f32, 8 + uint64_t(gated));
    ASSERT_TRUE(made) << "no seed in " << kSeedAttempts << " gave an unambiguous problem";
    L1Problem& st = *made;
    Outputs o = run(st, kind, DType::f32, kNegativeCoef, kNaNPoison);
    const ref::Grads want = ref::ffn_backward(st.w, st.x, st.dyr, double(kNegativeCoef));
    const std::string what =
        std::string(ffn_kind_name(kind)) + " seed " + std::to_string(st.p.spec.seed);
    const double tol = tolerance_of(DType::f32);
    const ref::Matrix dx =
        ref::from_view(TensorView::matrix(o.dx.data(), DType::f32, kRows, kHidden));
    EXPECT_LE(ref::rel_error(dx, want.dx), tol) << what;
    if (gated) EXPECT_LE(ref::rel_error(f32_matrix(o.dgate), want.dgate), tol) << what;
    EXPECT_LE(ref::rel_error(f32_matrix(o.dup), want.dup), tol) << what;
    EXPECT_LE(ref::rel_error(f32_matrix(o.ddown), want.ddown), tol) << what;
  }
}

// The coefficient a user sets: finite and >= 0, else an Error naming it.
TEST(L1Coef, OptionMustBeFiniteAndNonNegative) {
  Problem p = testing::make_problem(
      {FfnKind::gated, 4, kHidden, kTile, DType::f32, Pattern::uniform, kDensity, kTile, seed(11)});
  for (double bad : {-1.0, -1e-30, double(kNaN), double(kInf), -double(kInf)}) {
    TrainingOptions opt;
    opt.l1_coef = bad;
    expect_named_error([&] { TrainingPlan plan(p.weights(), opt); }, "options.l1_coef");
  }
  for (double good : {0.0, 1e-3, 10.0}) {
    TrainingOptions opt;
    opt.l1_coef = good;
    EXPECT_EQ(TrainingPlan(p.weights(), opt).options().l1_coef, good);
  }
}

}  // namespace
}  // namespace twell::test
