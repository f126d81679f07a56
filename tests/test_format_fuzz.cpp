// Randomized property test of the untrusted-input surface: validate_twell, unpack_twell and
// build_column_index fed mutated valid TwELL buffers. Each must either agree with an independent
// decoder written from docs/format.md (when the mutation left the buffer valid) or throw
// twell::Error: never crash, never read or write out of bounds (run it under AddressSanitizer).
// Runs for TWELL_FUZZ_SECONDS (default kDefaultSeconds); the session seed replays a run.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common.hpp"

namespace twell::test {
namespace {

constexpr double kDefaultSeconds = 5.0;
constexpr int64_t kMaxRows = 40, kMaxCols = 700;
constexpr int kMaxMutations = 3;

double fuzz_seconds() {
  const char* s = std::getenv("TWELL_FUZZ_SECONDS");
  const double v = s ? std::strtod(s, nullptr) : kDefaultSeconds;
  return v > 0 ? v : kDefaultSeconds;
}

// One valid TwELL buffer and the dense planes it was packed from.
struct Sample {
  TwellShape shape;
  DType dtype = DType::f32;
  std::vector<std::vector<uint8_t>> dense;  // per plane, [rows, cols]
  std::vector<uint64_t> storage;            // the single-buffer form (8-byte words: aligned)
  TwellView view;
};

Sample make_sample(std::mt19937_64& rng) {
  auto pick = [&rng](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  const int32_t tiles[] = {1, 2, 3, 8, 16, 64, 256, int32_t(pick(1, 300))};
  const double densities[] = {0.0, 0.02, 0.1, 0.5, 1.0};
  Sample s;
  s.dtype = dtypes[pick(0, 2)];
  s.shape.rows = pick(0, kMaxRows);
  s.shape.cols = pick(1, kMaxCols);
  s.shape.tile = tiles[pick(0, 7)];
  s.shape.capacity = int32_t(pick(1, std::min<int64_t>(s.shape.tile, 40)));
  s.shape.planes = int32_t(pick(1, 2));
  const double density = densities[pick(0, 4)];
  const size_t es = dtype_size(s.dtype), n = size_t(s.shape.rows * s.shape.cols);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<bool> on(n);
  for (int64_t r = 0; r < s.shape.rows; ++r) {
    const bool dense_row = pick(0, 7) == 0;  // overflows whenever capacity < tile
    for (int64_t c = 0; c < s.shape.cols; ++c) on[size_t(r * s.shape.cols + c)] = dense_row || u(rng) < density;
  }
  for (int p = 0; p < s.shape.planes; ++p) {
    std::vector<uint8_t> d(n * es, 0);
    for (size_t i = 0; i < n; ++i) {
      if (!on[i]) continue;
      uint32_t bits = uint32_t(rng());
      if (p == 0 && (bits & (es == 4 ? 0x7fffffffu : 0x7fffu)) == 0) bits |= 1;  // plane 0: non-zero
      std::memcpy(d.data() + i * es, &bits, es);
    }
    s.dense.push_back(std::move(d));
  }
  // Backup rows: none (routed rows only listed), exactly enough, or spare.
  int64_t routed = 0;
  const int64_t nt = s.shape.num_tiles();
  for (int64_t r = 0; r < s.shape.rows; ++r) {
    bool over = false;
    for (int64_t t = 0; t < nt; ++t) {
      int64_t cnt = 0;
      for (int64_t c = t * s.shape.tile; c < std::min(s.shape.cols, (t + 1) * s.shape.tile); ++c)
        cnt += on[size_t(r * s.shape.cols + c)];
      over = over || cnt > s.shape.capacity;
    }
    routed += over;
  }
  const int64_t choice = pick(0, 2);
  s.shape.backup_capacity = choice == 0 || routed == 0 ? 0 : choice == 1 ? routed : pick(routed, s.shape.rows);
  s.storage.assign(s.shape.bytes(s.dtype) / sizeof(uint64_t) + 1, 0);
  s.view = make_twell_view(s.storage.data(), s.shape, s.dtype, Device::cpu());
  std::vector<TensorView> planes;
  for (auto& d : s.dense) planes.push_back(TensorView::matrix(d.data(), s.dtype, s.shape.rows, s.shape.cols));
  pack_twell(planes.data(), s.shape.planes, s.view);
  return s;
}

// ---- The independent decoder (docs/format.md), bounds-checked on every read. ----

struct Decoded {
  bool structure_ok = false;
  bool header_ok = false;
  bool listed_only = false;  // a routed row without a backup row (unpack cannot rebuild it)
};

bool header_matches(const TwellView& v) {
  if (v.header == nullptr) return true;
  TwellHeader h;
  std::memcpy(&h, v.header, sizeof h);
  const TwellShape& s = v.shape;
  return h.magic == kTwellMagic && h.version == kTwellVersion && h.dtype == uint8_t(v.dtype) &&
         h.planes == s.planes && h.tile == s.tile && h.capacity == s.capacity && h.rows == s.rows &&
         h.cols == s.cols && h.backup_capacity == s.backup_capacity && h.written == kTwellWritten &&
         h.reserved[0] == 0 && h.reserved[1] == 0 && h.reserved[2] == 0;
}

// The routed list read from its own side: routed_rows[0..num_routed) are distinct rows, each of
// whose row_slot points back, and no other row has a slot.
Decoded decode(const TwellView& v) {
  const TwellShape& s = v.shape;
  Decoded d;
  d.header_ok = header_matches(v);
  const int64_t nr = *v.num_routed;
  if (nr < 0 || nr > s.rows || (s.backup_capacity > 0 && nr > s.backup_capacity)) return d;
  std::vector<int> listed(size_t(s.rows), 0);
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t r = v.routed_rows[i];
    if (r < 0 || r >= s.rows || listed[size_t(r)]++ || v.row_slot[r] != i) return d;
  }
  const int64_t nt = (s.cols + s.tile - 1) / s.tile;
  for (int64_t r = 0; r < s.rows; ++r) {
    if (listed[size_t(r)]) {
      d.listed_only = d.listed_only || s.backup_capacity == 0;
      continue;
    }
    if (v.row_slot[r] != -1) return d;
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t cnt = v.counts[r * nt + t], width = std::min<int64_t>(s.tile, s.cols - t * s.tile);
      if (cnt > s.capacity) return d;
      for (int64_t e = 0; e < cnt; ++e) {
        const int64_t c = v.cols[(r * nt + t) * s.capacity + e];
        if (c >= width || (e > 0 && c <= v.cols[(r * nt + t) * s.capacity + e - 1])) return d;
      }
    }
  }
  d.structure_ok = true;
  return d;
}

// Plane p densely (only for a valid structure with every routed row in a backup row).
std::vector<uint8_t> dense_of(const TwellView& v, int p) {
  const TwellShape& s = v.shape;
  const size_t es = dtype_size(v.dtype);
  const int64_t nt = (s.cols + s.tile - 1) / s.tile, plane = s.rows * nt * s.capacity;
  std::vector<uint8_t> out(size_t(s.rows * s.cols) * es, 0);
  for (int64_t r = 0; r < s.rows; ++r) {
    if (v.row_slot[r] >= 0) {
      const auto* b = static_cast<const uint8_t*>(v.backup) + size_t((p * s.backup_capacity + v.row_slot[r]) * s.cols) * es;
      std::memcpy(out.data() + size_t(r * s.cols) * es, b, size_t(s.cols) * es);
      continue;
    }
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t e = 0; e < v.counts[r * nt + t]; ++e) {
        const int64_t slot = (r * nt + t) * s.capacity + e, c = t * s.tile + v.cols[slot];
        std::memcpy(out.data() + size_t(r * s.cols + c) * es,
                    static_cast<const uint8_t*>(v.values) + size_t(p * plane + slot) * es, es);
      }
  }
  return out;
}

// (column, row, position) of every stored entry of plane 0, ordered by column then row.
std::vector<std::tuple<int64_t, int64_t, int64_t>> entries_of(const TwellView& v, RoutedRows routed) {
  const TwellShape& s = v.shape;
  const size_t es = dtype_size(v.dtype);
  const int64_t nt = (s.cols + s.tile - 1) / s.tile;
  std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
  for (int64_t r = 0; r < s.rows; ++r) {
    const int64_t slot = v.row_slot[r];
    if (slot >= 0) {
      if (routed == RoutedRows::skip) continue;
      for (int64_t c = 0; c < s.cols; ++c) {
        uint32_t bits = 0;
        std::memcpy(&bits, static_cast<const uint8_t*>(v.backup) + size_t(slot * s.cols + c) * es, es);
        if ((bits & (es == 4 ? 0x7fffffffu : 0x7fffu)) != 0)
          out.emplace_back(c, r, ColumnIndex::kBackupBit | (slot * s.cols + c));
      }
      continue;
    }
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t e = 0; e < v.counts[r * nt + t]; ++e) {
        const int64_t pos = (r * nt + t) * s.capacity + e;
        out.emplace_back(t * s.tile + v.cols[pos], r, pos);
      }
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  return out;
}

std::vector<std::tuple<int64_t, int64_t, int64_t>> entries_of(const ColumnIndex& ix) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
  for (size_t c = 0; c + 1 < ix.col_ptr.size(); ++c)
    for (int64_t j = ix.col_ptr[c]; j < ix.col_ptr[c + 1]; ++j)
      out.emplace_back(int64_t(c), ix.row[size_t(j)], ix.pos[size_t(j)]);
  return out;
}

// ---- Mutations ----

void mutate(Sample& s, std::mt19937_64& rng) {
  auto pick = [&rng](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  TwellView& v = s.view;
  const TwellShape& sh = s.shape;
  const int64_t nt = sh.num_tiles(), entries = sh.rows * nt;
  const int64_t special[] = {-2, -1, 0, 1, sh.rows - 1, sh.rows, sh.rows + 1, INT32_MAX, INT32_MIN};
  auto any_int = [&] { return pick(0, 1) ? special[pick(0, 8)] : int64_t(int32_t(rng())); };
  switch (pick(0, 9)) {
    case 0: {  // a random byte anywhere (values, padding, indices, header)
      auto* b = reinterpret_cast<uint8_t*>(s.storage.data());
      b[pick(0, int64_t(sh.bytes(s.dtype)) - 1)] ^= uint8_t(pick(1, 255));
      break;
    }
    case 1:
      if (entries) v.counts[pick(0, entries - 1)] = uint16_t(pick(0, 1) ? pick(0, sh.capacity + 2) : pick(0, 65535));
      break;
    case 2:
      if (entries) v.cols[pick(0, entries * sh.capacity - 1)] = uint16_t(pick(0, 1) ? pick(0, sh.tile) : pick(0, 65535));
      break;
    case 3:
      if (sh.rows) v.row_slot[pick(0, sh.rows - 1)] = int32_t(any_int());
      break;
    case 4:
      if (sh.rows) v.routed_rows[pick(0, sh.rows - 1)] = int32_t(any_int());
      break;
    case 5: *v.num_routed = int32_t(pick(0, 1) ? *v.num_routed + pick(-2, 2) : any_int()); break;
    case 6:
      if (v.header) reinterpret_cast<uint8_t*>(v.header)[pick(0, sizeof(TwellHeader) - 1)] ^= uint8_t(pick(1, 255));
      break;
    case 7:  // a count lowered (valid: entries dropped)
      if (entries) {
        uint16_t& c = v.counts[pick(0, entries - 1)];
        c = uint16_t(pick(0, c));
      }
      break;
    case 8: {  // two routed rows swap slots, backup rows with them (valid: the order is free)
      const int64_t nr = *v.num_routed;
      if (nr < 2 || nr > sh.rows || (sh.backup_capacity > 0 && nr > sh.backup_capacity)) break;
      const int64_t a = pick(0, nr - 1), b = pick(0, nr - 1);
      auto in_range = [&](int64_t i) { return v.routed_rows[i] >= 0 && v.routed_rows[i] < sh.rows; };
      if (!in_range(a) || !in_range(b)) break;
      std::swap(v.routed_rows[a], v.routed_rows[b]);
      v.row_slot[v.routed_rows[a]] = int32_t(a);
      v.row_slot[v.routed_rows[b]] = int32_t(b);
      const size_t es = dtype_size(s.dtype), row = size_t(sh.cols) * es;
      for (int p = 0; p < sh.planes && sh.backup_capacity > 0; ++p) {
        auto* base = static_cast<uint8_t*>(v.backup) + size_t(p * sh.backup_capacity) * row;
        std::swap_ranges(base + a * row, base + (a + 1) * row, base + b * row);
      }
      break;
    }
    default: v.header = pick(0, 1) ? nullptr : v.header; break;  // as a view made by hand
  }
}

template <class F>
bool throws_error(F&& f) {
  try {
    f();
    return false;
  } catch (const Error&) {
    return true;
  }
}

// Every reader on one (possibly mutated) sample, against the decoder.
void check_readers(const Sample& s, const std::string& where) {
  const TwellView& v = s.view;
  const Decoded d = decode(v);
  EXPECT_EQ(throws_error([&] { validate_twell(v); }), !(d.structure_ok && d.header_ok)) << where;
  for (int p = 0; p < s.shape.planes; ++p) {
    std::vector<uint8_t> out(size_t(s.shape.rows * s.shape.cols) * dtype_size(s.dtype));
    poison(out.data(), out.size());
    const bool threw = throws_error([&] {
      unpack_twell(v, p, TensorView::matrix(out.data(), s.dtype, s.shape.rows, s.shape.cols));
    });
    EXPECT_EQ(threw, !d.structure_ok || d.listed_only) << where << " unpack plane " << p;
    if (!threw && d.structure_ok) EXPECT_TRUE(out == dense_of(v, p)) << where << " unpack plane " << p;
  }
  for (RoutedRows routed : {RoutedRows::include, RoutedRows::skip}) {
    std::optional<ColumnIndex> ix;
    const bool threw = throws_error([&] { ix = build_column_index(v, routed); });
    const bool must_throw = !d.structure_ok || (routed == RoutedRows::include && d.listed_only);
    EXPECT_EQ(threw, must_throw) << where << " column index " << int(routed);
    if (!threw && !must_throw) EXPECT_TRUE(entries_of(*ix) == entries_of(v, routed)) << where << " column index";
  }
}

TEST(FormatFuzz, MutatedBuffersAgreeWithTheDecoderOrRaise) {
  const double seconds = fuzz_seconds();
  const auto start = std::chrono::steady_clock::now();
  int64_t iterations = 0, valid_after = 0;
  double elapsed = 0;
  for (;; ++iterations) {
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed >= seconds || ::testing::Test::HasFailure()) break;
    std::mt19937_64 rng(seed(uint64_t(iterations) + 1));
    Sample s = make_sample(rng);
    const std::string where = "iteration " + std::to_string(iterations) + " (rows " +
                              std::to_string(s.shape.rows) + ", cols " + std::to_string(s.shape.cols) +
                              ", tile " + std::to_string(s.shape.tile) + ", capacity " +
                              std::to_string(s.shape.capacity) + ", backup " +
                              std::to_string(s.shape.backup_capacity) + ")";
    const Decoded fresh = decode(s.view);  // the packer's output is valid and round-trips
    ASSERT_TRUE(fresh.structure_ok && fresh.header_ok) << where;
    if (!fresh.listed_only)
      for (int p = 0; p < s.shape.planes; ++p)  // zeros are +0 and plane 0 has no other zero
        ASSERT_TRUE(dense_of(s.view, p) == s.dense[size_t(p)]) << where << " plane " << p;
    const int mutations = int(std::uniform_int_distribution<int>(1, kMaxMutations)(rng));
    for (int m = 0; m < mutations; ++m) mutate(s, rng);
    valid_after += decode(s.view).structure_ok;
    check_readers(s, where);
  }
  std::printf("format fuzz: %lld iterations in %.1f s (%lld structurally valid after mutation)\n",
              static_cast<long long>(iterations), elapsed, static_cast<long long>(valid_after));
  EXPECT_GT(iterations, 0);
}

}  // namespace
}  // namespace twell::test
