// validate_twell and the structural check every reader of a caller's TwELL buffer runs first.
#include "format/validate.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/check.hpp"
#include "twell/error.hpp"

namespace twell {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

namespace detail {

void check_twell_arrays(const char* op, const TwellView& v, const std::string& prefix) {
  const TwellShape& s = v.shape;
  const bool any_rows = s.rows > 0;
  const size_t value = dtype_size(v.dtype);
  auto need = [&](const void* p, bool has_elements, const char* name, size_t align) {
    if (has_elements && p == nullptr) throw Error(op, prefix + name, "an array", "a null pointer");
    check_alignment(op, (prefix + name).c_str(), p, align);
  };
  need(v.values, any_rows, "values", value);
  need(v.cols, any_rows, "cols", sizeof(uint16_t));
  need(v.counts, any_rows, "counts", sizeof(uint16_t));
  need(v.row_slot, any_rows, "row_slot", sizeof(int32_t));
  need(v.routed_rows, any_rows, "routed_rows", sizeof(int32_t));
  need(v.num_routed, true, "num_routed", sizeof(int32_t));
  need(v.backup, s.backup_capacity > 0, "backup", value);
  need(v.header, false, "header", alignof(TwellHeader));
}

void check_twell_structure(const char* op, const TwellView& in) {
  const TwellShape& s = in.shape;
  s.validate(op);
  if (!is_float_dtype(in.dtype)) throw Error(op, "dtype", "float32, float16 or bfloat16", dtype_name(in.dtype));
  if (in.device != Device::cpu()) throw Error(op, "device", "cpu", to_string(in.device));
  check_twell_arrays(op, in);
  const int64_t nt = s.num_tiles();
  const int32_t routed = *in.num_routed;
  if (routed < 0 || routed > s.rows) throw Error(op, "num_routed", "0..rows (" + str(s.rows) + ")", str(routed));
  if (s.backup_capacity > 0 && routed > s.backup_capacity)
    throw Error(op, "num_routed", "<= backup capacity " + str(s.backup_capacity), str(routed));
  int64_t flagged = 0;
  for (int64_t m = 0; m < s.rows; ++m) {
    const int32_t slot = in.row_slot[m];
    const std::string row = "row " + str(m);
    if (slot >= 0) {
      if (slot >= routed || in.routed_rows[slot] != m)
        throw Error(op, row + " slot", "a slot s < num_routed with routed_rows[s] == row", "slot " + str(slot));
      ++flagged;
      continue;
    }
    if (slot != -1) throw Error(op, row + " slot", "-1 or a routed slot", str(slot));
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t cnt = in.counts[m * nt + t];
      if (cnt > s.capacity)
        throw Error(op, row + " tile " + str(t) + " count", "<= capacity " + str(s.capacity), str(cnt));
      const int64_t width = std::min<int64_t>(s.tile, s.cols - t * s.tile);
      const uint16_t* cols = in.cols + (m * nt + t) * s.capacity;
      int64_t prev = -1;
      for (int64_t k = 0; k < cnt; ++k) {
        const int64_t c = cols[k];
        if (c <= prev || c >= width)
          throw Error(op, row + " tile " + str(t) + " entry " + str(k),
                      "ascending column in (" + str(prev) + ", " + str(width) + ")", str(c));
        prev = c;
      }
    }
  }
  // Each flagged row owns a distinct slot below num_routed (routed_rows[slot] names it), so equal
  // counts make routed_rows[0..num_routed) exactly the flagged rows.
  if (flagged != routed)
    throw Error(op, "routed rows", str(routed) + " rows with a slot (num_routed)", str(flagged));
}

}  // namespace detail

namespace {

void validate_with(const TwellView& in, const uint64_t* owner) {
  const char* op = "validate_twell";
  in.shape.validate(op);
  if (!is_float_dtype(in.dtype)) throw Error(op, "dtype", "float32, float16 or bfloat16", dtype_name(in.dtype));
  if (in.device != Device::cpu()) throw Error(op, "device", "cpu", to_string(in.device));
  if (owner != nullptr && in.header == nullptr)
    throw Error(op, "header", "a header (a view from make_twell_view)", "none");
  if (in.header != nullptr) {
    TwellHeader got;
    std::memcpy(&got, in.header, sizeof got);
    check_twell_header(op, got, make_twell_header(in.shape, in.dtype, owner ? *owner : 0),
                       owner ? OwnerCheck::match : OwnerCheck::any);
  }
  detail::check_twell_structure(op, in);
}

}  // namespace

void validate_twell(const TwellView& in) { validate_with(in, nullptr); }
void validate_twell(const TwellView& in, uint64_t owner) { validate_with(in, &owner); }

}  // namespace twell
