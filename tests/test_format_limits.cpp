// Limits of the format and of size arithmetic: uint16 counts (capacity <= 65535), shapes whose
// sizes overflow int64, views of invalid rank, and allocations too large for memory.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define TWELL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TWELL_TEST_ASAN 1
#endif
#endif

namespace twell::test {
namespace {

constexpr int32_t kWideTile = 65536;

// A gated f32 FFN with N = 65536 and K = 2 whose row 0 activates every neuron but the last (65535
// entries in the one tile: the most a uint16 count holds) and row 1 every neuron (65536).
struct WideTileFfn {
  static constexpr int64_t kN = kWideTile, kK = 2, kM = 2;
  std::vector<float> gate, up, down, x, y;
  WideTileFfn() : gate(kN * kK), up(kN * kK), down(kN * kK), x{1, 0, 0, 1}, y(kM * kK) {
    // Values on a 1/8 grid: every product and partial sum of a row's 65535 terms is a multiple of
    // 2^-9 below 2^12, exact in fp32 in any order, so y is the oracle's whatever the seed.
    std::mt19937_64 rng(seed(40));
    std::uniform_int_distribution<int> eighths(4, 7);
    const auto u = [&](std::mt19937_64& r) { return float(eighths(r)) / 8.0f; };  // 0.5 .. 0.875
    for (int64_t n = 0; n < kN; ++n) {
      gate[size_t(n * kK)] = n == kN - 1 ? -u(rng) : u(rng);
      gate[size_t(n * kK + 1)] = u(rng);
      for (int64_t k = 0; k < kK; ++k) {
        up[size_t(n * kK + k)] = u(rng) - 0.75f;
        down[size_t(n * kK + k)] = u(rng) - 0.75f;
      }
    }
  }
  FfnWeights weights() {
    FfnWeights w;
    w.kind = FfnKind::gated;
    w.gate = TensorView::matrix(gate.data(), DType::f32, kN, kK);
    w.up = TensorView::matrix(up.data(), DType::f32, kN, kK);
    w.down = TensorView::matrix(down.data(), DType::f32, kN, kK);
    return w;
  }
};

TEST(FormatLimits, Capacity65536IsRejectedEverywhere) {
  WideTileFfn f;
  InferenceOptions io;
  io.tile = kWideTile;
  io.capacity = kWideTile;
  io.dispatch = Dispatch::force_sparse;
  try {
    InferencePlan plan(f.weights(), io);
    ADD_FAILURE() << "inference accepted capacity 65536";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "options.capacity") << e.what();
  }
  TrainingOptions to;
  to.tile = kWideTile;
  to.capacity = kWideTile;
  try {
    TrainingPlan plan(f.weights(), to);
    ADD_FAILURE() << "training accepted capacity 65536";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "options.capacity") << e.what();
  }
  TwellShape s;
  s.rows = 1, s.cols = kWideTile, s.tile = kWideTile, s.capacity = kWideTile;
  EXPECT_THROW(s.validate("t"), Error);
  s.capacity = kMaxTwellCapacity;
  EXPECT_NO_THROW(s.validate("t"));
}

TEST(FormatLimits, Capacity65535IsExactOnAFullTile) {
  WideTileFfn f;
  const ref::Forward want = ref::ffn_forward(ref::from_weights(f.weights()),
                                             ref::from_view(TensorView::matrix(f.x.data(), DType::f32, 2, 2)));
  for (Dispatch d : {Dispatch::force_sparse, Dispatch::automatic}) {
    InferenceOptions io;
    io.tile = kWideTile;
    io.capacity = kMaxTwellCapacity;
    io.dispatch = d;
    InferencePlan plan(f.weights(), io);
    poison(f.y.data(), f.y.size() * sizeof(float));
    plan.run({TensorView::matrix(f.x.data(), DType::f32, 2, 2), TensorView::matrix(f.y.data(), DType::f32, 2, 2)});
    double err = 0, norm = 0;
    for (int64_t i = 0; i < 4; ++i) {
      err = std::max(err, std::abs(double(f.y[size_t(i)]) - want.y.v[size_t(i)]));
      norm = std::max(norm, std::abs(want.y.v[size_t(i)]));
    }
    EXPECT_LE(err, 1e-5 * norm) << "dispatch " << int(d);
    const RunInfo info = plan.last_run();
    EXPECT_EQ(info.active, 2 * kWideTile - 1);
    if (!info.ran_dense) EXPECT_EQ(info.routed_rows, 1);  // row 1: 65536 entries, over capacity
  }
}

TEST(FormatLimits, ShapeSizesAreChecked) {
  TwellShape s;
  s.rows = 4, s.cols = int64_t(1) << 62, s.tile = 1, s.capacity = 1;  // wrapped to 48 bytes once
  EXPECT_THROW(s.validate("t"), Error);
  EXPECT_THROW(s.bytes(DType::f32), Error);
  std::vector<uint64_t> small(8);
  EXPECT_THROW(make_twell_view(small.data(), s, DType::f32, Device::cpu()), Error);
  TwellView v;
  v.shape = s;
  v.values = v.backup = small.data();
  v.cols = v.counts = reinterpret_cast<uint16_t*>(small.data());
  v.row_slot = v.routed_rows = v.num_routed = reinterpret_cast<int32_t*>(small.data());
  EXPECT_THROW(validate_twell(v), Error);
  EXPECT_THROW(build_column_index(v), Error);

  s.rows = 0, s.cols = INT64_MAX, s.tile = 256;  // num_tiles must not overflow
  EXPECT_EQ(s.num_tiles(), INT64_MAX / 256 + 1);
  s.tile = 2, s.capacity = 2;  // num_tiles * capacity = 2^63
  EXPECT_THROW(s.slots_per_row(), Error);
  EXPECT_THROW(s.validate("t"), Error);
  s.rows = 1 << 20, s.cols = int64_t(1) << 41, s.tile = 1, s.capacity = 1, s.backup_capacity = 0;
  try {
    s.validate("t");
    ADD_FAILURE() << "2^61 slots accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overflow"), std::string::npos) << e.what();
  }
}

TEST(FormatLimits, TensorViewNumelAndRank) {
  std::vector<float> one(1);
  TensorView t = TensorView::matrix(one.data(), DType::f32, int64_t(1) << 40, int64_t(1) << 40);
  try {
    (void)t.numel();
    ADD_FAILURE() << "[2^40, 2^40] numel accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "shape");
    EXPECT_NE(e.actual().find("1099511627776"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)t.is_contiguous(), Error);
  t.rank = 5;
  EXPECT_THROW((void)t.numel(), Error);
  EXPECT_EQ(t.shape_string(), "<rank 5>");
  t.rank = -1;
  EXPECT_THROW((void)t.numel(), Error);
  EXPECT_EQ(t.shape_string(), "<rank -1>");
  t.rank = 4;
  t.shape = {2, 3, 4, 5};
  EXPECT_EQ(t.numel(), 120);
  EXPECT_EQ(t.shape_string(), "[2, 3, 4, 5]");
}

// Weights of N = 2^40 neurons (views only: nothing reads them before the checks below).
FfnWeights huge_weights(float* any) {
  const int64_t n = int64_t(1) << 40;
  FfnWeights w;
  w.kind = FfnKind::gated;
  w.gate = w.up = w.down = TensorView::matrix(any, DType::f32, n, 1);
  return w;
}

TEST(FormatLimits, SavedShapeOfAHugeLayerIsChecked) {
  float any = 0;
  TrainingPlan plan(huge_weights(&any), {});
  const TwellShape ok = plan.saved_shape(4);  // 2^37 slots per row: still within int64 bytes
  EXPECT_GT(ok.bytes(plan.saved_dtype()), size_t(1) << 40);
  try {
    (void)plan.saved_shape(int64_t(1) << 30);
    ADD_FAILURE() << "a saved shape of 2^67 slots accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), "TrainingPlan::saved_shape") << e.what();
  }
  EXPECT_THROW((void)plan.saved_shape(int64_t(1) << 30, SavedForm::compact), Error);
}

TEST(FormatLimits, AllocationsTooLargeRaiseError) {
#if defined(TWELL_TEST_ASAN)
  GTEST_SKIP() << "AddressSanitizer aborts on an allocation larger than it supports instead of "
                  "failing it";
#else
  TwellShape s;  // about 2^62 bytes of backup rows: more than any address space
  s.rows = 1 << 20, s.cols = int64_t(1) << 40, s.tile = kWideTile, s.capacity = 1;
  s.backup_capacity = s.rows;
  ASSERT_GT(s.bytes(DType::f32), size_t(1) << 61);
  try {
    TwellMatrix m(s, DType::f32);
    ADD_FAILURE() << "a 2^62-byte matrix allocated";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "shape") << e.what();
  }
  // SavedActivations of M = 1024 rows of a 2^40-neuron layer: 2^50 bytes.
  float any = 0;
  TrainingPlan plan(huge_weights(&any), {});
  std::vector<float> x(1024, 1.0f), y(1024);
  SavedActivations saved;
  try {
    plan.forward({TensorView::matrix(x.data(), DType::f32, 1024, 1),
                  TensorView::matrix(y.data(), DType::f32, 1024, 1)},
                 saved);
    ADD_FAILURE() << "2^50 bytes of saved state allocated";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "saved") << e.what();
  }
  // A bfloat16 layer of 2^40 neurons: the CPU plan's float32 copy of a weight (4 TiB) fails.
  uint16_t any16 = 0;
  FfnWeights half = huge_weights(&any);
  half.gate = half.up = half.down = TensorView::matrix(&any16, DType::bf16, int64_t(1) << 40, 1);
  expect_named_error([&] { InferencePlan bad(half); }, "memory", "InferencePlan");
  // A float32 one runs without a copy, but one row's gate values alone take 4 TiB of workspace.
  InferencePlan wide(huge_weights(&any));
  static float x1 = 1, y1 = 0;  // below the stack: outside the weights' 4 TiB from `any` up
  expect_named_error([&] {
    wide.run({TensorView::matrix(&x1, DType::f32, 1, 1), TensorView::matrix(&y1, DType::f32, 1, 1)});
  }, "memory", "InferencePlan::run");
#endif
}

// pack_twell with no array of planes: an Error, not a null dereference.
TEST(FormatLimits, PackWithoutPlanesRaises) {
  TwellShape s;
  s.rows = 2, s.cols = 8, s.tile = 8, s.capacity = 2;
  TwellMatrix m(s, DType::f32);
  expect_named_error([&] { pack_twell(nullptr, 1, m.view()); }, "planes", "a null pointer");
  expect_named_error([&] { (void)pack_twell(nullptr, 1, 8, 2); }, "planes", "a null pointer");
  std::vector<float> dense(16);
  TensorView plane = TensorView::matrix(nullptr, DType::f32, 2, 8);
  expect_named_error([&] { pack_twell(&plane, 1, m.view()); }, "dense plane 0", "none");
  plane.data = dense.data();
  EXPECT_EQ(pack_twell(&plane, 1, m.view()).nonzeros, 0);
}

}  // namespace
}  // namespace twell::test
