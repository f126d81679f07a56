// TwELL format: bit-exact round trips, routing, validation, column index.
#include <random>

#include "common.hpp"

namespace twell::test {
namespace {

struct Dense {
  int64_t rows, cols;
  DType dt;
  std::vector<uint8_t> a, b;  // plane 0 (pattern) and plane 1
  TensorView view(int p) { return TensorView::matrix((p ? b : a).data(), dt, rows, cols); }
};

// ARANGE-style values (distinct per element, so any layout slip shows) on a random pattern.
// Rows r % 5 == 3 are made dense inside tile 0 so they route at small capacities.
Dense make_dense(int64_t rows, int64_t cols, DType dt, double density, uint64_t s) {
  Dense d{rows, cols, dt, {}, {}};
  d.a.assign(size_t(rows * cols) * dtype_size(dt), 0);
  d.b.assign(d.a.size(), 0);
  std::mt19937_64 rng(s);
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const bool on = u(rng) < density || (r % 5 == 3 && c < 40);
      const float v = on ? float((r * cols + c) % 997 + 1) * 0.25f : 0.0f;
      store_float(d.a.data(), dt, r * cols + c, v);
      store_float(d.b.data(), dt, r * cols + c, on ? -v - 0.5f : 0.0f);
    }
  return d;
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<DType, int, int, int>> {};

TEST_P(RoundTrip, BitExactWithBackup) {
  const auto [dt, tile, capacity, planes] = GetParam();
  if (capacity > tile) {  // not a valid shape: must be refused, not packed
    Dense d = make_dense(3, 10, dt, 0.5, seed(0));
    TensorView in[2] = {d.view(0), d.view(1)};
    EXPECT_THROW(pack_twell(in, planes, tile, capacity), Error);
    return;
  }
  for (const int64_t cols : {1, 7, 255, 256, 257, 700}) {
    Dense d = make_dense(23, cols, dt, 0.07, seed(uint64_t(cols + tile * 131 + capacity)));
    TensorView in[2] = {d.view(0), d.view(1)};
    TwellMatrix m = pack_twell(in, planes, tile, capacity);
    TwellView v = m.view();
    validate_twell(v);
    for (int p = 0; p < planes; ++p) {
      std::vector<uint8_t> out(d.a.size());
      poison(out.data(), out.size());
      unpack_twell(v, p, TensorView::matrix(out.data(), dt, d.rows, cols));
      EXPECT_EQ(out, p ? d.b : d.a) << "cols=" << cols << " plane=" << p;
    }
    // Rows made dense in their first 40 columns overflow whenever a tile there holds more.
    if (std::min(tile, 40) > capacity && cols >= 40) EXPECT_GE(m.num_routed(), 4) << "cols=" << cols;
  }
}

std::string round_trip_name(const ::testing::TestParamInfo<RoundTrip::ParamType>& info) {
  const DType dt = std::get<0>(info.param);
  return std::string(dtype_name(dt)) + "_t" + std::to_string(std::get<1>(info.param)) + "_c" +
         std::to_string(std::get<2>(info.param)) + "_p" + std::to_string(std::get<3>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Format, RoundTrip,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16, DType::f16),
                                            ::testing::Values(1, 8, 64, 256),
                                            ::testing::Values(1, 4, 32), ::testing::Values(1, 2)),
                         round_trip_name);

TEST(Format, EntriesAreTileLocalAndSorted) {
  Dense d = make_dense(6, 600, DType::f32, 0.05, seed(1));
  TensorView in[1] = {d.view(0)};
  TwellMatrix m = pack_twell(in, 1, 256, 64);
  TwellView v = m.view();
  const auto* vals = static_cast<const float*>(v.values);
  for (int64_t r = 0; r < 6; ++r) {
    if (v.row_slot[r] >= 0) continue;
    for (int64_t t = 0; t < v.shape.num_tiles(); ++t)
      for (int64_t e = 0; e < v.counts[r * 3 + t]; ++e) {
        const int64_t i = (r * 3 + t) * 64 + e, c = t * 256 + v.cols[i];
        EXPECT_EQ(vals[i], load_float(d.a.data(), DType::f32, r * 600 + c));
        if (e) EXPECT_LT(v.cols[i - 1], v.cols[i]);
      }
  }
}

TEST(Format, BackupCapacityTooSmallRaises) {
  Dense d = make_dense(10, 64, DType::f32, 0.0, seed(2));  // rows 3 and 8 route at capacity 4
  TensorView in[1] = {d.view(0)};
  TwellShape s;
  s.rows = 10, s.cols = 64, s.tile = 64, s.capacity = 4, s.backup_capacity = 1;
  TwellMatrix m(s, DType::f32);
  try {
    pack_twell(in, 1, m.view());
    FAIL() << "expected twell::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "backup capacity");
    EXPECT_EQ(e.expected(), ">= 2 rows");
  }
}

TEST(Format, RoutedRowWithoutBackupIsListedNotDropped) {
  Dense d = make_dense(10, 64, DType::f32, 0.0, seed(3));
  TensorView in[1] = {d.view(0)};
  TwellShape s;
  s.rows = 10, s.cols = 64, s.tile = 64, s.capacity = 4;
  TwellMatrix m(s, DType::f32);
  const PackResult r = pack_twell(in, 1, m.view());
  EXPECT_EQ(r.routed_rows, 2);
  EXPECT_EQ(r.nonzeros, 80);
  TwellView v = m.view();
  EXPECT_EQ(*v.num_routed, 2);
  EXPECT_EQ(v.routed_rows[0], 3);
  EXPECT_EQ(v.routed_rows[1], 8);
  validate_twell(v);
  std::vector<float> out(640);
  EXPECT_THROW(unpack_twell(v, 0, TensorView::matrix(out.data(), DType::f32, 10, 64)), Error);
}

TEST(Format, ValidateCatchesCorruption) {
  Dense d = make_dense(8, 300, DType::f32, 0.1, seed(4));
  TensorView in[1] = {d.view(0)};
  auto fresh = [&] { return pack_twell(in, 1, 256, 64); };
  {
    TwellMatrix m = fresh();
    TwellView v = m.view();
    v.counts[0] = 65;
    EXPECT_THROW(validate_twell(v), Error);
  }
  {
    TwellMatrix m = fresh();
    TwellView v = m.view();
    ASSERT_GE(v.counts[0], 2);
    std::swap(v.cols[0], v.cols[1]);
    EXPECT_THROW(validate_twell(v), Error);
  }
  {
    TwellMatrix m = fresh();  // last tile is 44 wide: a column of 50 is outside the matrix
    TwellView v = m.view();
    const int64_t i = (0 * 2 + 1) * 64 + v.counts[1];
    v.cols[i] = 50;
    v.counts[1] += 1;
    EXPECT_THROW(validate_twell(v), Error);
  }
  {
    TwellMatrix m = fresh();
    TwellView v = m.view();
    v.row_slot[2] = 0;  // claims a slot nobody listed
    EXPECT_THROW(validate_twell(v), Error);
  }
}

TEST(Format, ShapeValidation) {
  TwellShape s;
  s.rows = 4, s.cols = 10, s.tile = 0;
  EXPECT_THROW(s.validate("t"), Error);
  s.tile = 8, s.capacity = 9;
  EXPECT_THROW(s.validate("t"), Error);
  s.capacity = 8, s.planes = 3;
  EXPECT_THROW(s.validate("t"), Error);
  s.planes = 1, s.backup_capacity = 5;
  EXPECT_THROW(s.validate("t"), Error);
  s.backup_capacity = 0;
  EXPECT_NO_THROW(s.validate("t"));
  s.rows = int64_t(1) << 31;  // past int32 row indices (routed_rows, row_slot)
  try {
    s.validate("t");
    ADD_FAILURE() << "rows = 2^31 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows"), std::string::npos) << e.what();
  }
}

TEST(Format, ColumnIndexMatchesDense) {
  Dense d = make_dense(30, 270, DType::bf16, 0.08, seed(5));
  TensorView in[1] = {d.view(0)};
  TwellMatrix m = pack_twell(in, 1, 64, 8);
  ASSERT_GT(m.num_routed(), 0);
  TwellView v = m.view();
  const ColumnIndex ix = build_column_index(v);
  int64_t total = 0;
  for (int64_t c = 0; c < 270; ++c) {
    std::vector<int32_t> expect;
    for (int64_t r = 0; r < 30; ++r)
      if (load_float(d.a.data(), DType::bf16, r * 270 + c) != 0) expect.push_back(int32_t(r));
    std::vector<int32_t> got(ix.row.begin() + ix.col_ptr[size_t(c)], ix.row.begin() + ix.col_ptr[size_t(c + 1)]);
    EXPECT_EQ(got, expect) << "column " << c;
    for (int64_t j = ix.col_ptr[size_t(c)]; j < ix.col_ptr[size_t(c + 1)]; ++j) {
      const int64_t pos = ix.pos[size_t(j)];
      const float val = (pos & ColumnIndex::kBackupBit)
                            ? load_float(v.backup, DType::bf16, pos & ~ColumnIndex::kBackupBit)
                            : load_float(v.values, DType::bf16, pos);
      EXPECT_EQ(val, load_float(d.a.data(), DType::bf16, ix.row[size_t(j)] * 270 + c));
    }
    total += int64_t(expect.size());
  }
  EXPECT_EQ(total, int64_t(ix.row.size()));
}

TEST(DType, HalfConversionsRoundToNearestEven) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 1.0009765625f}) {
    EXPECT_EQ(to_float(to_f16(f)), f) << f;
    EXPECT_EQ(to_float(to_bf16(f)), round_to(DType::bf16, f));
  }
  EXPECT_EQ(to_float(to_f16(1.0f + 1.0f / 2048)), 1.0f);               // tie to even (down)
  EXPECT_EQ(to_float(to_f16(1.0f + 3.0f / 2048)), 1.0f + 1.0f / 512);  // tie to even (up)
  EXPECT_TRUE(std::isinf(to_float(to_f16(70000.0f))));
  EXPECT_EQ(to_float(to_bf16(1.0f + 1.0f / 256)), 1.0f);  // bf16 tie to even
  // Every f16 bit pattern survives a round trip through float.
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const f16 h{uint16_t(b)};
    const float f = to_float(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(to_f16(f).bits, h.bits) << b;
  }
}

}  // namespace
}  // namespace twell::test
