// TwELL format: bit-exact round trips, routing, validation, column index.
#include <cstddef>
#include <cstring>
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

// The single-buffer form of docs/format.md, recomputed here: every array 16-byte aligned, in order.
struct ExpectedLayout {
  size_t values, backup, cols, counts, row_slot, routed_rows, num_routed, header, total;
};
ExpectedLayout expected_layout(const TwellShape& s, DType dt) {
  const size_t nt = size_t((s.cols + s.tile - 1) / s.tile), slots = size_t(s.rows) * nt * size_t(s.capacity);
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t here = at;
    at += (bytes + 15) / 16 * 16;
    return here;
  };
  ExpectedLayout l{};
  l.values = take(size_t(s.planes) * slots * dtype_size(dt));
  l.backup = take(size_t(s.planes * s.backup_capacity * s.cols) * dtype_size(dt));
  l.cols = take(slots * 2);
  l.counts = take(size_t(s.rows) * nt * 2);
  l.row_slot = take(size_t(s.rows) * 4);
  l.routed_rows = take(size_t(s.rows) * 4);
  l.num_routed = take(4);
  l.header = take(64);
  l.total = at;
  return l;
}

TEST(FormatHeader, LastArrayOfTheSingleBufferForm) {
  static_assert(sizeof(TwellHeader) == 64);
  EXPECT_EQ(offsetof(TwellHeader, dtype), 6u);
  EXPECT_EQ(offsetof(TwellHeader, rows), 16u);
  EXPECT_EQ(offsetof(TwellHeader, owner), 40u);
  EXPECT_EQ(offsetof(TwellHeader, written), 48u);
  const char magic[4] = {'T', 'w', 'E', 'L'};
  EXPECT_EQ(std::memcmp(&kTwellMagic, magic, 4), 0);
  TwellShape s;
  s.rows = 5, s.cols = 300, s.tile = 64, s.capacity = 8, s.planes = 2, s.backup_capacity = 3;
  for (DType dt : {DType::f32, DType::bf16}) {
    const ExpectedLayout l = expected_layout(s, dt);
    ASSERT_EQ(s.bytes(dt), l.total);
    std::vector<uint64_t> storage(l.total / 8 + 1);
    auto* b = reinterpret_cast<uint8_t*>(storage.data());
    const TwellView v = make_twell_view(b, s, dt, Device::cpu());
    EXPECT_EQ(static_cast<uint8_t*>(v.values) - b, ptrdiff_t(l.values));
    EXPECT_EQ(static_cast<uint8_t*>(v.backup) - b, ptrdiff_t(l.backup));
    EXPECT_EQ(reinterpret_cast<uint8_t*>(v.cols) - b, ptrdiff_t(l.cols));
    EXPECT_EQ(reinterpret_cast<uint8_t*>(v.counts) - b, ptrdiff_t(l.counts));
    EXPECT_EQ(reinterpret_cast<uint8_t*>(v.row_slot) - b, ptrdiff_t(l.row_slot));
    EXPECT_EQ(reinterpret_cast<uint8_t*>(v.routed_rows) - b, ptrdiff_t(l.routed_rows));
    EXPECT_EQ(reinterpret_cast<uint8_t*>(v.num_routed) - b, ptrdiff_t(l.num_routed));
    EXPECT_EQ(reinterpret_cast<uint8_t*>(v.header) - b, ptrdiff_t(l.header));
    EXPECT_EQ(l.header + 64, l.total);
    EXPECT_THROW(make_twell_view(b + 8, s, dt, Device::cpu()), Error);  // not 16-byte aligned
  }
}

TEST(FormatHeader, PackWritesItAndValidateChecksEveryField) {
  Dense d = make_dense(9, 200, DType::bf16, 0.1, seed(6));
  TensorView in[2] = {d.view(0), d.view(1)};
  TwellMatrix m = pack_twell(in, 2, 64, 4);
  TwellView v = m.view();
  ASSERT_NE(v.header, nullptr);
  const TwellHeader want = make_twell_header(m.shape(), DType::bf16, 0);
  EXPECT_EQ(std::memcmp(v.header, &want, sizeof want), 0);
  EXPECT_EQ(v.header->magic, kTwellMagic);
  EXPECT_EQ(v.header->version, kTwellVersion);
  EXPECT_EQ(v.header->dtype, uint8_t(DType::bf16));
  EXPECT_EQ(v.header->planes, 2);
  EXPECT_EQ(v.header->rows, 9);
  EXPECT_EQ(v.header->cols, 200);
  EXPECT_EQ(v.header->tile, 64);
  EXPECT_EQ(v.header->capacity, 4);
  EXPECT_EQ(v.header->backup_capacity, m.shape().backup_capacity);
  EXPECT_EQ(v.header->owner, 0u);
  EXPECT_EQ(v.header->written, kTwellWritten);
  validate_twell(v);
  validate_twell(v, 0);
  EXPECT_THROW(validate_twell(v, 7), Error);

  struct Mutation {
    const char* field;
    void (*apply)(TwellHeader&);
  };
  const Mutation mutations[] = {
      {"header magic", [](TwellHeader& h) { h.magic ^= 1; }},
      {"header version", [](TwellHeader& h) { h.version = 2; }},
      {"header dtype", [](TwellHeader& h) { h.dtype = uint8_t(DType::f16); }},
      {"header planes", [](TwellHeader& h) { h.planes = 1; }},
      {"header tile", [](TwellHeader& h) { h.tile = 32; }},
      {"header capacity", [](TwellHeader& h) { h.capacity = 5; }},
      {"header rows", [](TwellHeader& h) { h.rows = 8; }},
      {"header cols", [](TwellHeader& h) { h.cols = 201; }},
      {"header backup_capacity", [](TwellHeader& h) { h.backup_capacity += 1; }},
      {"header written", [](TwellHeader& h) { h.written = 0; }},
      {"header reserved", [](TwellHeader& h) { h.reserved[2] = 1; }},
  };
  for (const Mutation& mu : mutations) {
    TwellHeader h = want;
    mu.apply(h);
    std::memcpy(v.header, &h, sizeof h);
    try {
      validate_twell(v);
      ADD_FAILURE() << mu.field << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), mu.field) << e.what();
    }
    std::vector<uint8_t> out(d.a.size());  // readers check the structure, not the header
    unpack_twell(v, 0, TensorView::matrix(out.data(), DType::bf16, d.rows, d.cols));
    EXPECT_EQ(out, d.a) << mu.field;
  }
  TwellHeader owned = want;
  owned.owner = 0x1234;
  std::memcpy(v.header, &owned, sizeof owned);
  validate_twell(v);  // any owner
  validate_twell(v, 0x1234);
  try {
    validate_twell(v, 0x1235);
    ADD_FAILURE() << "a foreign owner accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "header owner");
  }
  EXPECT_NO_THROW(check_twell_header("t", owned, want, OwnerCheck::any));
  EXPECT_THROW(check_twell_header("t", owned, want, OwnerCheck::match), Error);
}

TEST(FormatHeader, UnwrittenOrZeroBuffersAreRefused) {
  TwellShape s;
  s.rows = 4, s.cols = 100, s.tile = 32, s.capacity = 4;
  TwellMatrix fresh(s, DType::f32);  // an empty matrix no pack has filled
  try {
    validate_twell(fresh.view());
    ADD_FAILURE() << "an unwritten matrix accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "header written");
  }
  std::vector<uint64_t> zeros(s.bytes(DType::f32) / 8 + 1, 0);  // forward never ran
  try {
    validate_twell(make_twell_view(zeros.data(), s, DType::f32, Device::cpu()));
    ADD_FAILURE() << "an all-zero buffer accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "header magic");
  }
  Dense d = make_dense(4, 100, DType::f32, 0.05, seed(7));
  TensorView in[1] = {d.view(0)};
  TwellMatrix m(s, DType::f32);
  pack_twell(in, 1, m.view());
  validate_twell(m.view());  // the pack wrote it
}

TEST(FormatHeader, ViewsWithoutAHeaderKeepWorking) {
  Dense d = make_dense(12, 150, DType::f16, 0.1, seed(8));
  TensorView in[1] = {d.view(0)};
  TwellMatrix m = pack_twell(in, 1, 32, 4);
  TwellView v = m.view();
  v.header = nullptr;  // as a view made by hand
  validate_twell(v);
  std::vector<uint8_t> out(d.a.size());
  poison(out.data(), out.size());
  unpack_twell(v, 0, TensorView::matrix(out.data(), DType::f16, 12, 150));
  EXPECT_EQ(out, d.a);
  EXPECT_EQ(build_column_index(v).row.size(), build_column_index(m.view()).row.size());
  EXPECT_THROW(validate_twell(v, 0), Error);  // an owner check needs a header
  TwellShape s = m.shape();
  std::vector<uint64_t> storage(s.bytes(DType::f16) / 8 + 1);
  TwellView into = make_twell_view(storage.data(), s, DType::f16, Device::cpu());
  into.header = nullptr;
  pack_twell(in, 1, into);
  validate_twell(into);
}

// Each corruption a caller's buffer can carry: every reader raises Error before indexing with it.
TEST(FormatCorruption, ReadersRaiseInsteadOfIndexing) {
  Dense d = make_dense(10, 300, DType::f32, 0.02, seed(9));
  TensorView in[1] = {d.view(0)};
  struct Corruption {
    const char* name;
    void (*apply)(TwellView&);
  };
  // Tile 256, capacity 16: rows 3 and 8 route (40 dense columns in tile 0); tile 1 is 44 wide.
  const Corruption corruptions[] = {
      {"count > capacity", [](TwellView& v) { v.counts[0] = 17; }},
      {"count 65535", [](TwellView& v) { v.counts[1] = 65535; }},
      {"column 65535", [](TwellView& v) { v.cols[0] = 65535, v.counts[0] = std::max<uint16_t>(v.counts[0], 1); }},
      {"column past the last tile", [](TwellView& v) { v.cols[16] = 50, v.counts[1] = 1; }},
      {"columns not ascending", [](TwellView& v) { v.cols[0] = 9, v.cols[1] = 9, v.counts[0] = 2; }},
      {"row_slot below -1", [](TwellView& v) { v.row_slot[0] = -2; }},
      {"row_slot past num_routed", [](TwellView& v) { v.row_slot[0] = 5; }},
      {"row_slot huge", [](TwellView& v) { v.row_slot[0] = INT32_MAX; }},
      {"routed_rows not pointing back", [](TwellView& v) { v.routed_rows[0] = 4; }},
      {"routed_rows out of range", [](TwellView& v) { v.routed_rows[1] = 1 << 30; }},
      {"num_routed negative", [](TwellView& v) { *v.num_routed = -1; }},
      {"num_routed > rows", [](TwellView& v) { *v.num_routed = 11; }},
      {"num_routed > backup capacity", [](TwellView& v) { *v.num_routed = 3; }},
      {"num_routed below the flagged rows", [](TwellView& v) { *v.num_routed = 1; }},
      {"row flagged twice", [](TwellView& v) { v.row_slot[3] = 1; }},
  };
  for (const Corruption& c : corruptions) {
    TwellMatrix m = pack_twell(in, 1, 256, 16);
    ASSERT_EQ(m.num_routed(), 2);
    TwellView v = m.view();
    c.apply(v);
    std::vector<float> out(size_t(10 * 300));
    poison(out.data(), out.size() * sizeof(float));
    EXPECT_THROW(validate_twell(v), Error) << c.name;
    EXPECT_THROW(unpack_twell(v, 0, TensorView::matrix(out.data(), DType::f32, 10, 300)), Error) << c.name;
    EXPECT_THROW(build_column_index(v), Error) << c.name;
    EXPECT_THROW(build_column_index(v, RoutedRows::skip), Error) << c.name;
  }
}

// Hand-computed roundings against known bit patterns (not against the conversion's own definition).
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DType, Bf16RoundsToNearestEvenOnKnownBits) {
  const std::pair<uint32_t, uint16_t> cases[] = {
      {0x3f800000u, 0x3f80},  // 1
      {0x3f808000u, 0x3f80},  // 1 + 2^-8: a tie, to even (down)
      {0x3f818000u, 0x3f82},  // 1 + 3 * 2^-8: a tie, to even (up)
      {0x3f808001u, 0x3f81},  // just above the tie
      {0x3f807fffu, 0x3f80},  // just below the tie
      {0xc0200000u, 0xc020},  // -2.5
      {0x7f7f7fffu, 0x7f7f},  // below the tie under the largest bf16
      {0x7f7f8000u, 0x7f80},  // tie at the largest bf16 (odd): rounds up to infinity
      {0x7f7fffffu, 0x7f80},  // FLT_MAX: infinity
      {0x00010000u, 0x0001},  // the smallest subnormal bf16
      {0x00008000u, 0x0000},  // half of it: a tie, to even (zero)
      {0x00018000u, 0x0002},  // 1.5 of it: a tie, to even (up)
      {0x80000000u, 0x8000},  // -0
      {0x7f800000u, 0x7f80},  // inf
      {0xff800000u, 0xff80},  // -inf
      {0x7fc00000u, 0x7fc0},  // quiet NaN
      {0x7f800001u, 0x7fc0},  // signalling NaN whose payload is below bf16: stays NaN (quiet)
      {0xffc00001u, 0xffc0},  // negative NaN keeps its sign
  };
  for (const auto& [in, want] : cases) {
    EXPECT_EQ(to_bf16(float_of(in)).bits, want) << std::hex << in;
    const float back = round_to(DType::bf16, float_of(in));
    if ((want & 0x7fffu) > 0x7f80u) {
      EXPECT_TRUE(std::isnan(back)) << std::hex << in;
    } else {
      EXPECT_EQ(bits_of(back), uint32_t(want) << 16) << std::hex << in;
    }
  }
  EXPECT_EQ(round_to(DType::bf16, 1.0f + 0x1p-8f), 1.0f);
  EXPECT_EQ(round_to(DType::bf16, 1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
  EXPECT_EQ(to_float(bf16{0x0001}), 0x1p-133f);
  EXPECT_EQ(round_to(DType::f32, 1.0f + 0x1p-20f), 1.0f + 0x1p-20f);  // f32: unchanged
}

TEST(DType, F16RoundsToNearestEvenOnKnownBits) {
  const std::pair<float, uint16_t> cases[] = {
      {1.0f, 0x3c00},
      {-2.5f, 0xc100},
      {1.0f + 0x1p-11f, 0x3c00},               // a tie, to even (down)
      {1.0f + 3 * 0x1p-11f, 0x3c02},           // a tie, to even (up)
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01},    // just above the tie
      {65504.0f, 0x7bff},                      // the largest f16
      {65519.0f, 0x7bff},                      // below the tie
      {65520.0f, 0x7c00},                      // tie at the largest (odd): infinity
      {70000.0f, 0x7c00},
      {0x1p-14f, 0x0400},                      // the smallest normal
      {1023 * 0x1p-24f, 0x03ff},               // the largest subnormal
      {0x1p-14f - 0x1p-25f, 0x0400},           // tie between them: to even (the normal)
      {0x1p-24f, 0x0001},                      // the smallest subnormal
      {0x1p-25f, 0x0000},                      // half of it: a tie, to even (zero)
      {0x1p-25f + 0x1p-40f, 0x0001},           // just above that tie
      {3 * 0x1p-25f, 0x0002},                  // 1.5 of it: a tie, to even (up)
      {-0.0f, 0x8000},
      {INFINITY, 0x7c00},
      {-INFINITY, 0xfc00},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(to_f16(in).bits, want) << in;
  EXPECT_EQ(to_f16(NAN).bits & 0x7fffu, 0x7e00u);
  EXPECT_EQ(to_f16(-NAN).bits, 0xfe00u);
  EXPECT_EQ(to_float(f16{0x0001}), 0x1p-24f);
  EXPECT_EQ(to_float(f16{0x03ff}), 1023 * 0x1p-24f);
  EXPECT_EQ(to_float(f16{0x7bff}), 65504.0f);
  EXPECT_EQ(to_float(f16{0xc100}), -2.5f);
  EXPECT_TRUE(std::isinf(to_float(f16{0xfc00})) && to_float(f16{0xfc00}) < 0);
  EXPECT_TRUE(std::isnan(to_float(f16{0x7e00})));
  EXPECT_TRUE(std::isnan(to_float(f16{0x7c01})));
  EXPECT_EQ(bits_of(to_float(f16{0x8000})), 0x80000000u);
  EXPECT_EQ(round_to(DType::f16, 1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);
  EXPECT_EQ(round_to(DType::f16, 0x1p-25f), 0.0f);
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
