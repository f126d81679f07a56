// TwELL shapes, the single-buffer layout, its header, views and the owning host matrix.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/checked.hpp"
#include "twell/format.hpp"

namespace twell {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

constexpr int64_t kArrayAlign = 16;     // every array of the single-buffer form starts at a multiple
constexpr int64_t kWidestValue = 4;     // bytes of the widest value dtype (float32)

// Offsets of the arrays inside the single-buffer form, in the order of docs/format.md. Every
// product and sum is checked: a shape whose form does not fit in int64 bytes raises Error(op).
struct Offsets {
  int64_t values, backup, cols, counts, row_slot, routed_rows, num_routed, header, total;
  Offsets(const TwellShape& s, int64_t value_bytes, const char* op) {
    using detail::checked_add;
    using detail::checked_mul;
    int64_t at = 0;
    auto take = [&](int64_t bytes, const char* what) {
      const int64_t here = at;
      const int64_t padded = checked_add<int64_t>(bytes, kArrayAlign - 1, op, what) / kArrayAlign * kArrayAlign;
      at = checked_add(at, padded, op, std::string("size"));
      return here;
    };
    const int64_t per_row = checked_mul<int64_t>(s.num_tiles(), s.capacity, op, "num_tiles * capacity");
    const int64_t slots = checked_mul(s.rows, per_row, op, "rows * slots per row");
    values = take(checked_mul(checked_mul<int64_t>(s.planes, slots, op, "values"), value_bytes, op, "values"),
                  "values");
    const int64_t backup_rows = checked_mul<int64_t>(s.planes, s.backup_capacity, op, "backup");
    backup = take(checked_mul(checked_mul(backup_rows, s.cols, op, "backup"), value_bytes, op, "backup"),
                  "backup");
    cols = take(checked_mul<int64_t>(slots, sizeof(uint16_t), op, "cols"), "cols");
    counts = take(checked_mul<int64_t>(checked_mul(s.rows, s.num_tiles(), op, "counts"), sizeof(uint16_t),
                                       op, "counts"),
                  "counts");
    row_slot = take(s.rows * int64_t(sizeof(int32_t)), "row_slot");  // rows <= INT32_MAX
    routed_rows = take(s.rows * int64_t(sizeof(int32_t)), "routed_rows");
    num_routed = take(sizeof(int32_t), "num_routed");
    header = take(sizeof(TwellHeader), "header");
    total = at;
  }
};

}  // namespace

void TwellShape::validate(const char* op) const {
  if (rows < 0 || rows > INT32_MAX) throw Error(op, "rows", "0..2147483647 (int32 row indices)", str(rows));
  if (cols < 1) throw Error(op, "cols", ">= 1", str(cols));
  if (tile < 1 || tile > kMaxTwellTile) throw Error(op, "tile", "1.." + str(kMaxTwellTile), str(tile));
  if (capacity < 1 || capacity > tile || capacity > kMaxTwellCapacity)
    throw Error(op, "capacity", "1..min(tile, " + str(kMaxTwellCapacity) + ")", str(capacity));
  if (planes < 1 || planes > 2) throw Error(op, "planes", "1 or 2", str(planes));
  if (backup_capacity < 0 || backup_capacity > rows)
    throw Error(op, "backup capacity", "0..rows (" + str(rows) + ")", str(backup_capacity));
  Offsets(*this, kWidestValue, op);  // every size of every dtype fits in int64
}

int64_t TwellShape::slots_per_row() const {
  return detail::checked_mul<int64_t>(num_tiles(), capacity, "TwellShape::slots_per_row",
                                      "num_tiles * capacity");
}

size_t TwellShape::bytes(DType dtype) const {
  const char* op = "TwellShape::bytes";
  validate(op);
  return size_t(Offsets(*this, int64_t(dtype_size(dtype)), op).total);
}

TwellHeader make_twell_header(const TwellShape& shape, DType dtype, uint64_t owner) {
  shape.validate("make_twell_header");
  TwellHeader h{};
  h.magic = kTwellMagic;
  h.version = kTwellVersion;
  h.dtype = uint8_t(dtype);
  h.planes = uint8_t(shape.planes);
  h.tile = shape.tile;
  h.capacity = shape.capacity;
  h.rows = shape.rows;
  h.cols = shape.cols;
  h.backup_capacity = shape.backup_capacity;
  h.owner = owner;
  h.written = kTwellWritten;
  return h;
}

void check_twell_header(const char* op, const TwellHeader& got, const TwellHeader& want, OwnerCheck owner) {
  auto field = [op](const char* name, uint64_t g, uint64_t w, bool as_hex) {
    if (g != w)
      throw Error(op, std::string("header ") + name, as_hex ? hex(w) : str(int64_t(w)),
                  as_hex ? hex(g) : str(int64_t(g)));
  };
  field("magic", got.magic, want.magic, true);
  field("version", got.version, want.version, false);
  if (got.dtype != want.dtype)
    throw Error(op, "header dtype", dtype_name(DType(want.dtype)),
                got.dtype <= uint8_t(DType::u8) ? dtype_name(DType(got.dtype)) : str(got.dtype));
  field("planes", got.planes, want.planes, false);
  field("tile", uint64_t(got.tile), uint64_t(want.tile), false);
  field("capacity", uint64_t(got.capacity), uint64_t(want.capacity), false);
  field("rows", uint64_t(got.rows), uint64_t(want.rows), false);
  field("cols", uint64_t(got.cols), uint64_t(want.cols), false);
  field("backup_capacity", uint64_t(got.backup_capacity), uint64_t(want.backup_capacity), false);
  if (owner == OwnerCheck::match) field("owner", got.owner, want.owner, true);
  if (got.written != want.written)
    throw Error(op, "header written", hex(want.written) + " (a complete pack)",
                hex(got.written) + (got.written == 0 ? " (never written, or a write in progress)" : ""));
  for (uint32_t r : got.reserved) field("reserved", r, 0, true);
}

TwellView make_twell_view(void* buffer, const TwellShape& shape, DType dtype, Device device) {
  const char* op = "make_twell_view";
  shape.validate(op);
  if (!is_float_dtype(dtype)) throw Error(op, "dtype", "float32, float16 or bfloat16", dtype_name(dtype));
  if (buffer == nullptr) throw Error(op, "buffer", "memory", "null");
  if (reinterpret_cast<uintptr_t>(buffer) % kArrayAlign != 0)
    throw Error(op, "buffer", "an address aligned to " + str(kArrayAlign) + " bytes",
                hex(reinterpret_cast<uintptr_t>(buffer)));
  const Offsets o(shape, int64_t(dtype_size(dtype)), op);
  auto* b = static_cast<uint8_t*>(buffer);
  TwellView v;
  v.shape = shape;
  v.dtype = dtype;
  v.device = device;
  v.values = b + o.values;
  v.backup = shape.backup_capacity ? b + o.backup : nullptr;
  v.cols = reinterpret_cast<uint16_t*>(b + o.cols);
  v.counts = reinterpret_cast<uint16_t*>(b + o.counts);
  v.row_slot = reinterpret_cast<int32_t*>(b + o.row_slot);
  v.routed_rows = reinterpret_cast<int32_t*>(b + o.routed_rows);
  v.num_routed = reinterpret_cast<int32_t*>(b + o.num_routed);
  v.header = reinterpret_cast<TwellHeader*>(b + o.header);
  return v;
}

TwellMatrix::TwellMatrix(const TwellShape& shape, DType dtype) : shape_(shape), dtype_(dtype) {
  const char* op = "TwellMatrix";
  shape.validate(op);
  if (!is_float_dtype(dtype)) throw Error(op, "dtype", "float32, float16 or bfloat16", dtype_name(dtype));
  const size_t bytes = shape.bytes(dtype);
  detail::allocate_or_throw(op, "shape", bytes, [&] { storage_.assign(bytes, 0); });
  TwellView v = view();
  std::fill(v.row_slot, v.row_slot + shape.rows, -1);
  TwellHeader h = make_twell_header(shape, dtype, 0);
  h.written = 0;  // an empty matrix until a pack fills it
  std::memcpy(v.header, &h, sizeof h);
}

int32_t TwellMatrix::num_routed() const {
  return storage_.empty() ? 0 : *const_cast<TwellMatrix*>(this)->view().num_routed;
}

TwellView TwellMatrix::view() {
  if (storage_.empty()) return TwellView{};
  return make_twell_view(storage_.data(), shape_, dtype_, Device::cpu());
}

}  // namespace twell
