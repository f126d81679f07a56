#include "core/check.hpp"

#include <cstdio>
#include <iterator>

#include "core/checked.hpp"

namespace twell::detail {

namespace {

std::string hex(uintptr_t v) {
  char buf[2 + 2 * sizeof(uintptr_t) + 1];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::optional<Error> common_error(const char* op, const char* name, const TensorView& t, DType dt,
                                  Device dev) {
  if (t.dtype != dt) return Error(op, name, dtype_name(dt), dtype_name(t.dtype));
  if (t.device != dev) return Error(op, name, "device " + to_string(dev), to_string(t.device));
  if (!t.is_contiguous()) {
    std::string s = "[";
    for (int i = 0; i < t.rank; ++i) s += (i ? ", " : "") + std::to_string(t.stride[size_t(i)]);
    return Error(op, name, "a contiguous row-major tensor", "strides " + s + "]");
  }
  return alignment_error(op, name, t.data, dtype_size(dt));
}

std::string describe(const ByteRange& r) {
  return std::string(r.name) + " bytes [" + hex(r.begin) + ", " + hex(r.end) + ")";
}

bool addresses_nothing(const ByteRange& r) { return r.begin >= r.end; }

bool overlaps(const ByteRange& a, const ByteRange& b) {
  if (a.device != b.device || addresses_nothing(a) || addresses_nothing(b)) return false;
  return a.begin < b.end && b.begin < a.end;
}

// [base - below, base + above) as a ByteRange, or an Error when it leaves the address space.
ByteRange place(const char* op, const char* name, Device dev, uintptr_t base, uint64_t below,
                uint64_t above) {
  if (below > base || above > UINTPTR_MAX - base)
    throw Error(op, name, "a view inside the address space",
                hex(base) + " - " + std::to_string(below) + " .. + " + std::to_string(above) + " bytes");
  return {name, dev, base - uintptr_t(below), base + uintptr_t(above)};
}

}  // namespace

std::optional<Error> alignment_error(const char* op, const char* name, const void* p, size_t align) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  if (at % align == 0) return std::nullopt;
  return Error(op, name, "data aligned to " + std::to_string(align) + " bytes", "address " + hex(at));
}

std::optional<Error> layout_error(const char* op, const char* name, const TensorView& t, DType dt,
                                  Device dev) {
  return common_error(op, name, t, dt, dev);
}

std::optional<Error> shape_error(const char* op, const char* name, const TensorView& t) {
  if (t.rank < 0 || t.rank > TensorView::kMaxRank)
    return Error(op, name, "rank 0.." + std::to_string(TensorView::kMaxRank),
                 "rank " + std::to_string(t.rank));
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[size_t(i)] < 0) return Error(op, name, "non-negative dimensions", t.shape_string());
  return std::nullopt;
}

std::optional<Error> matrix_error(const char* op, const char* name, const TensorView& t,
                                  int64_t rows, int64_t cols, DType dt, Device dev) {
  if (auto e = shape_error(op, name, t)) return e;
  const bool empty = t.rank == 2 && t.shape[0] == 0;  // an empty batch may have no storage
  if (!t.defined() && !empty) return Error(op, name, "a tensor", "none");
  if (t.rank != 2 || (rows >= 0 && t.shape[0] != rows) || t.shape[1] != cols) {
    const std::string r = rows < 0 ? std::string("M") : std::to_string(rows);
    return Error(op, name, "[" + r + ", " + std::to_string(cols) + "]", t.shape_string());
  }
  return common_error(op, name, t, dt, dev);
}

std::optional<Error> vector_error(const char* op, const char* name, const TensorView& t, int64_t n,
                                  DType dt, Device dev) {
  if (auto e = shape_error(op, name, t)) return e;
  if (!t.defined()) return Error(op, name, "a tensor", "none");
  if (t.rank != 1 || t.shape[0] != n)
    return Error(op, name, "[" + std::to_string(n) + "]", t.shape_string());
  return common_error(op, name, t, dt, dev);
}

ByteRange byte_range(const char* op, const char* name, const TensorView& t) {
  if (auto e = shape_error(op, name, t)) throw *e;
  ByteRange none{name, t.device, 0, 0};
  if (!t.defined()) return none;
  // Element offsets of the lowest and highest addressed element relative to t.data.
  int64_t low = 0, high = 0;
  for (int i = 0; i < t.rank; ++i) {
    const int64_t n = t.shape[size_t(i)];
    if (n == 0) return none;
    const int64_t span = checked_mul<int64_t>(n - 1, t.stride[size_t(i)], op, name);
    if (span < 0) low = checked_add<int64_t>(low, span, op, name);
    else high = checked_add<int64_t>(high, span, op, name);
  }
  const auto size = static_cast<int64_t>(dtype_size(t.dtype));
  const int64_t below = checked_mul<int64_t>(low, -size, op, name);
  const int64_t above = checked_add<int64_t>(checked_mul<int64_t>(high, size, op, name), size, op, name);
  return place(op, name, t.device, reinterpret_cast<uintptr_t>(t.data), uint64_t(below),
               uint64_t(above));
}

ByteRange byte_range(const char* op, const char* name, const void* p, size_t bytes, Device dev) {
  if (p == nullptr || bytes == 0) return {name, dev, 0, 0};
  return place(op, name, dev, reinterpret_cast<uintptr_t>(p), 0, bytes);
}

std::vector<ByteRange> saved_byte_ranges(const char* op, const TwellView& v) {
  const char* name = "saved";
  const TwellShape& s = v.shape;
  if (s.rows < 0 || s.cols < 0 || s.tile < 1 || s.capacity < 0 || s.planes < 0 ||
      s.backup_capacity < 0)
    throw Error(op, "saved shape", "non-negative sizes and a tile >= 1",
                "rows " + std::to_string(s.rows) + ", cols " + std::to_string(s.cols) + ", tile " +
                    std::to_string(s.tile) + ", capacity " + std::to_string(s.capacity));
  const auto es = static_cast<int64_t>(dtype_size(v.dtype));
  const int64_t cells = checked_mul<int64_t>(s.rows, s.num_tiles(), op, name);
  const int64_t slots = checked_mul<int64_t>(cells, s.capacity, op, name);
  const int64_t plane_values = checked_mul<int64_t>(slots, es, op, name);
  const int64_t backup_row = checked_mul<int64_t>(s.cols, es, op, name);
  const int64_t backup_plane = checked_mul<int64_t>(s.backup_capacity, backup_row, op, name);
  const int64_t index = sizeof(uint16_t), row = sizeof(int32_t);
  const struct {
    const char* array;
    const void* data;
    int64_t bytes;
  } arrays[] = {
      {"saved values", v.values, checked_mul<int64_t>(s.planes, plane_values, op, name)},
      {"saved cols", v.cols, checked_mul<int64_t>(slots, index, op, name)},
      {"saved counts", v.counts, checked_mul<int64_t>(cells, index, op, name)},
      {"saved row_slot", v.row_slot, checked_mul<int64_t>(s.rows, row, op, name)},
      {"saved routed_rows", v.routed_rows, checked_mul<int64_t>(s.rows, row, op, name)},
      {"saved num_routed", v.num_routed, row},
      {"saved backup", v.backup, checked_mul<int64_t>(s.planes, backup_plane, op, name)},
      {"saved header", v.header, int64_t(sizeof(TwellHeader))},
  };
  std::vector<ByteRange> out;
  out.reserve(std::size(arrays));
  for (const auto& a : arrays) out.push_back(byte_range(op, a.array, a.data, size_t(a.bytes), v.device));
  return out;
}

std::optional<Error> overlap_error(const char* op, const std::vector<ByteRange>& outputs,
                                   const std::vector<ByteRange>& inputs) {
  auto error = [&](const ByteRange& out, const ByteRange& other) {
    return Error(op, out.name, std::string("no overlap with ") + other.name,
                 describe(out) + " and " + describe(other) + " share bytes");
  };
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (const ByteRange& in : inputs)
      if (overlaps(outputs[i], in)) return error(outputs[i], in);
    for (size_t j = i + 1; j < outputs.size(); ++j)
      if (overlaps(outputs[i], outputs[j])) return error(outputs[i], outputs[j]);
  }
  return std::nullopt;
}

}  // namespace twell::detail
