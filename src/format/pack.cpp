// TwELL pack / unpack on the CPU. Values are copied as raw bytes, so a round trip is bit-exact (a
// zero of either sign is a zero; unpack writes +0).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/check.hpp"
#include "core/checked.hpp"
#include "format/validate.hpp"
#include "twell/format.hpp"

namespace twell {

namespace {

bool is_zero(const uint8_t* p, DType t) {
  switch (t) {
    case DType::f32: { uint32_t u; std::memcpy(&u, p, 4); return (u & 0x7fffffffu) == 0; }
    default: { uint16_t u; std::memcpy(&u, p, 2); return (u & 0x7fffu) == 0; }
  }
}

std::string str(int64_t v) { return std::to_string(v); }

void check_planes_pointer(const char* op, const TensorView* planes) {
  if (planes == nullptr) throw Error(op, "planes", "an array of dense plane views", "a null pointer");
}

// Pass 1 of a pack: the rows with a tile over capacity (ascending) and the non-zeros of plane 0.
std::vector<int32_t> rows_to_route(const TensorView& plane0, int32_t tile, int32_t capacity,
                                   int64_t* nonzeros) {
  const int64_t rows = plane0.shape[0], cols = plane0.shape[1], nt = cols / tile + (cols % tile != 0);
  const size_t es = dtype_size(plane0.dtype);
  const auto* base = static_cast<const uint8_t*>(plane0.data);
  std::vector<int32_t> routed;
  *nonzeros = 0;
  for (int64_t m = 0; m < rows; ++m) {
    bool fits = true;
    for (int64_t t = 0; t < nt; ++t) {
      int64_t cnt = 0;
      const int64_t c1 = std::min<int64_t>(cols, (t + 1) * tile);
      for (int64_t c = t * tile; c < c1; ++c) cnt += !is_zero(base + (m * cols + c) * es, plane0.dtype);
      *nonzeros += cnt;
      fits = fits && cnt <= capacity;
    }
    if (!fits) routed.push_back(int32_t(m));
  }
  return routed;
}

void set_written(const TwellView& out, uint32_t written) {
  if (out.header != nullptr) std::memcpy(&out.header->written, &written, sizeof written);
}

// Pass 2 of a pack, given pass 1's routed rows (ascending): writes every array of `out`, the
// header last.
void write_packed(const TensorView* planes, const TwellView& out, const std::vector<int32_t>& routed) {
  const TwellShape& s = out.shape;
  const size_t es = dtype_size(out.dtype);
  const int64_t nt = s.num_tiles();
  const auto* base0 = static_cast<const uint8_t*>(planes[0].data);
  set_written(out, 0);

  // Compact rows; routed rows get zero counts, a slot and (with backup) their dense rows.
  const size_t plane_slots = size_t(s.rows * s.slots_per_row());
  auto* vals = static_cast<uint8_t*>(out.values);
  auto* backup = static_cast<uint8_t*>(out.backup);
  if (plane_slots > 0) {
    std::memset(vals, 0, plane_slots * es * size_t(s.planes));
    std::memset(out.cols, 0, plane_slots * sizeof(uint16_t));
  }
  size_t next_routed = 0;
  for (int64_t m = 0; m < s.rows; ++m) {
    const bool is_routed = next_routed < routed.size() && routed[next_routed] == m;
    uint16_t* counts = out.counts + m * nt;
    if (is_routed) {
      const int32_t slot = int32_t(next_routed++);
      out.row_slot[m] = slot;
      out.routed_rows[slot] = int32_t(m);
      std::memset(counts, 0, size_t(nt) * sizeof(uint16_t));
      for (int p = 0; p < s.planes && s.backup_capacity > 0; ++p)
        std::memcpy(backup + (size_t(p) * s.backup_capacity + slot) * s.cols * es,
                    static_cast<const uint8_t*>(planes[p].data) + m * s.cols * es, s.cols * es);
      continue;
    }
    out.row_slot[m] = -1;
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t slot0 = (m * nt + t) * s.capacity;
      int64_t k = 0;
      const int64_t c1 = std::min<int64_t>(s.cols, (t + 1) * s.tile);
      for (int64_t c = t * s.tile; c < c1; ++c) {
        if (is_zero(base0 + (m * s.cols + c) * es, out.dtype)) continue;
        out.cols[slot0 + k] = uint16_t(c - t * s.tile);
        for (int p = 0; p < s.planes; ++p)
          std::memcpy(vals + (p * plane_slots + size_t(slot0 + k)) * es,
                      static_cast<const uint8_t*>(planes[p].data) + (m * s.cols + c) * es, es);
        ++k;
      }
      counts[t] = uint16_t(k);  // k <= capacity <= kMaxTwellCapacity
    }
  }
  *out.num_routed = int32_t(routed.size());
  if (out.header != nullptr) {
    const TwellHeader h = make_twell_header(s, out.dtype, 0);
    std::memcpy(out.header, &h, sizeof h);
  }
}

}  // namespace

PackResult pack_twell(const TensorView* planes, int num_planes, const TwellView& out) {
  const char* op = "pack_twell";
  const TwellShape& s = out.shape;
  s.validate(op);
  if (!is_float_dtype(out.dtype)) throw Error(op, "out dtype", "float32, float16 or bfloat16", dtype_name(out.dtype));
  if (out.device != Device::cpu()) throw Error(op, "out device", "cpu", to_string(out.device));
  detail::check_twell_arrays(op, out);
  if (num_planes != s.planes) throw Error(op, "planes", str(s.planes), str(num_planes));
  check_planes_pointer(op, planes);
  for (int p = 0; p < num_planes; ++p)
    detail::check_matrix(op, p == 0 ? "dense plane 0" : "dense plane 1", planes[p], s.rows, s.cols,
                         out.dtype, Device::cpu());
  PackResult r;
  const std::vector<int32_t> routed = detail::translate_allocation_failure(
      op, [&] { return rows_to_route(planes[0], s.tile, s.capacity, &r.nonzeros); });
  r.routed_rows = int64_t(routed.size());
  if (s.backup_capacity > 0 && r.routed_rows > s.backup_capacity)
    throw Error(op, "backup capacity", ">= " + str(r.routed_rows) + " rows",
                str(s.backup_capacity) + " rows");
  write_packed(planes, out, routed);
  return r;
}

TwellMatrix pack_twell(const TensorView* planes, int num_planes, int32_t tile, int32_t capacity) {
  if (num_planes < 1 || num_planes > 2) throw Error("pack_twell", "planes", "1 or 2", str(num_planes));
  check_planes_pointer("pack_twell", planes);
  detail::check_matrix("pack_twell", "dense plane 0", planes[0], -1, planes[0].cols(),
                       planes[0].dtype, Device::cpu());
  TwellShape s;
  s.rows = planes[0].shape[0];
  s.cols = planes[0].shape[1];
  s.tile = tile;
  s.capacity = capacity;
  s.planes = num_planes;
  s.validate("pack_twell");
  for (int p = 1; p < num_planes; ++p)
    detail::check_matrix("pack_twell", "dense plane 1", planes[p], s.rows, s.cols, planes[0].dtype,
                         Device::cpu());
  int64_t nonzeros = 0;
  const std::vector<int32_t> routed = detail::translate_allocation_failure(
      "pack_twell", [&] { return rows_to_route(planes[0], tile, capacity, &nonzeros); });
  s.backup_capacity = int64_t(routed.size());  // exactly the rows that need it
  TwellMatrix m(s, planes[0].dtype);
  write_packed(planes, m.view(), routed);
  return m;
}

void unpack_twell(const TwellView& in, int plane, const TensorView& dense) {
  const char* op = "unpack_twell";
  const TwellShape& s = in.shape;
  detail::check_twell_structure(op, in);
  if (plane < 0 || plane >= s.planes) throw Error(op, "plane", "0.." + str(s.planes - 1), str(plane));
  detail::check_matrix(op, "dense", dense, s.rows, s.cols, in.dtype, Device::cpu());
  if (s.rows == 0) return;  // an empty batch may have no storage
  const size_t es = dtype_size(in.dtype);
  const int64_t nt = s.num_tiles();
  const size_t plane_slots = size_t(s.rows * s.slots_per_row());
  auto* dst = static_cast<uint8_t*>(dense.data);
  const auto* vals = static_cast<const uint8_t*>(in.values) + plane * plane_slots * es;
  const auto* backup = static_cast<const uint8_t*>(in.backup);
  std::memset(dst, 0, size_t(detail::checked_mul<int64_t>(dense.numel(), int64_t(es), op, "dense")));
  for (int64_t m = 0; m < s.rows; ++m) {
    const int32_t slot = in.row_slot[m];
    if (slot >= 0) {
      if (slot >= s.backup_capacity)  // only listed: nothing to read it from
        throw Error(op, "row " + str(m), "a backup row (it is routed)",
                    "backup capacity " + str(s.backup_capacity));
      std::memcpy(dst + m * s.cols * es,
                  backup + (size_t(plane) * s.backup_capacity + slot) * s.cols * es, s.cols * es);
      continue;
    }
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t slot0 = (m * nt + t) * s.capacity;
      for (int64_t k = 0; k < in.counts[m * nt + t]; ++k) {
        const int64_t c = t * s.tile + in.cols[slot0 + k];
        std::memcpy(dst + (m * s.cols + c) * es, vals + size_t(slot0 + k) * es, es);
      }
    }
  }
}

}  // namespace twell
