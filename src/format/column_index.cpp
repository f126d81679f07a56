// Per-neuron (column-major) index of a TwELL matrix's non-zeros, the view backward passes need.
#include <string>

#include "core/checked.hpp"
#include "format/validate.hpp"
#include "twell/error.hpp"
#include "twell/format.hpp"

namespace twell {

ColumnIndex build_column_index(const TwellView& in, RoutedRows routed) {
  const char* op = "build_column_index";
  const TwellShape& s = in.shape;
  detail::check_twell_structure(op, in);
  const int64_t nt = s.num_tiles();
  const auto* backup = static_cast<const uint8_t*>(in.backup);
  auto backup_nonzero = [&](int64_t slot, int64_t c) {
    return load_float(backup, in.dtype, slot * s.cols + c) != 0.0f;
  };
  ColumnIndex ix;
  const int64_t ptrs = detail::checked_add<int64_t>(s.cols, 1, op, "cols");
  detail::allocate_or_throw(op, "col_ptr", size_t(ptrs) * sizeof(int64_t),
                            [&] { ix.col_ptr.assign(size_t(ptrs), 0); });
  // Visits every stored non-zero of plane 0 as (row, column, position).
  auto for_each = [&](auto&& fn) {
    for (int64_t m = 0; m < s.rows; ++m) {
      const int32_t slot = in.row_slot[m];
      if (slot >= 0 && routed == RoutedRows::skip) continue;
      if (slot >= 0) {
        if (slot >= s.backup_capacity)  // only listed: nothing to read it from
          throw Error(op, "row " + std::to_string(m), "a backup row (it is routed)", "none");
        for (int64_t c = 0; c < s.cols; ++c)
          if (backup_nonzero(slot, c)) fn(m, c, ColumnIndex::kBackupBit | (slot * s.cols + c));
        continue;
      }
      for (int64_t t = 0; t < nt; ++t) {
        const int64_t slot0 = (m * nt + t) * s.capacity;
        for (int64_t k = 0; k < in.counts[m * nt + t]; ++k)
          fn(m, t * s.tile + in.cols[slot0 + k], slot0 + k);
      }
    }
  };
  for_each([&](int64_t, int64_t c, int64_t) { ++ix.col_ptr[size_t(c + 1)]; });
  for (int64_t c = 0; c < s.cols; ++c) ix.col_ptr[size_t(c + 1)] += ix.col_ptr[size_t(c)];
  const size_t nnz = size_t(ix.col_ptr.back());
  detail::allocate_or_throw(op, "entries", nnz * (sizeof(int32_t) + sizeof(int64_t)), [&] {
    ix.row.resize(nnz);
    ix.pos.resize(nnz);
  });
  std::vector<int64_t> next;
  detail::allocate_or_throw(op, "col_ptr", size_t(s.cols) * sizeof(int64_t),
                            [&] { next.assign(ix.col_ptr.begin(), ix.col_ptr.end() - 1); });
  for_each([&](int64_t m, int64_t c, int64_t pos) {
    const size_t i = size_t(next[size_t(c)]++);
    ix.row[i] = int32_t(m);
    ix.pos[i] = pos;
  });
  return ix;
}

}  // namespace twell
