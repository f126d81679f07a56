// TwELL (tile-wise ELLPACK) and its hybrid companion: the byte layout is specified in docs/format.md.
//
// A [rows, cols] activation matrix is cut into column tiles of `tile` columns. Each (row, tile)
// owns `capacity` entry slots: the tile's non-zeros in ascending column order, as a value (one per
// value plane) and a uint16 column local to the tile, plus a uint16 count. A row with more than
// `capacity` non-zeros in any tile is *routed*: its compact entries are void, it is listed in
// routed_rows, and (when backup_capacity > 0) its dense values live in a backup row. Nothing is
// ever truncated.
#pragma once
#include <cstdint>
#include <vector>

#include "twell/tensor.hpp"

namespace twell {

struct TwellShape {
  int64_t rows = 0;
  int64_t cols = 0;            // N, the hidden width; the last tile is padded
  int32_t tile = 256;          // columns per tile, 1..65536
  int32_t capacity = 32;       // entry slots per (row, tile), 1..tile
  int32_t planes = 1;          // value planes sharing one index structure (2 for gated training)
  int64_t backup_capacity = 0; // dense backup rows available (0: routed rows are only listed)

  int64_t num_tiles() const { return (cols + tile - 1) / tile; }
  int64_t slots_per_row() const { return num_tiles() * capacity; }
  void validate(const char* op) const;  // throws Error naming the bad field
  // Bytes of the single-buffer form (every array, 16-byte aligned; docs/format.md).
  size_t bytes(DType dtype) const;
};

// Mutable view of a TwELL matrix. Arrays (all contiguous, row-major):
//   values      [planes, rows, num_tiles, capacity]  dtype
//   cols        [rows, num_tiles, capacity]          uint16, column within the tile
//   counts      [rows, num_tiles]                    uint16, valid entries (<= capacity)
//   row_slot    [rows]                               int32: -1 compact; s >= 0 routed, where
//                                                    routed_rows[s] == row and backup row s
//                                                    holds it (when backup_capacity > 0)
//   routed_rows [rows]                               int32, first *num_routed are valid
//   num_routed  [1]                                  int32
//   backup      [planes, backup_capacity, cols]      dtype, dense rows of routed rows
struct TwellView {
  TwellShape shape;
  DType dtype = DType::f32;
  Device device{};
  void* values = nullptr;
  uint16_t* cols = nullptr;
  uint16_t* counts = nullptr;
  int32_t* row_slot = nullptr;
  int32_t* routed_rows = nullptr;
  int32_t* num_routed = nullptr;
  void* backup = nullptr;
};

// Carves a view out of one buffer of at least shape.bytes(dtype) bytes (order and alignment in
// docs/format.md), on any device: how frameworks hold a TwELL matrix as a single byte tensor.
TwellView make_twell_view(void* buffer, const TwellShape& shape, DType dtype, Device device);

// Owning host (CPU) TwELL matrix.
class TwellMatrix {
 public:
  TwellMatrix() = default;
  TwellMatrix(const TwellShape& shape, DType dtype);
  TwellView view();
  const TwellShape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int32_t num_routed() const;

 private:
  TwellShape shape_{};
  DType dtype_ = DType::f32;
  std::vector<uint8_t> storage_;
};

struct PackResult {
  int64_t routed_rows = 0;     // rows that did not fit the compact capacity
  int64_t nonzeros = 0;        // non-zeros of plane 0 over all rows (routed included)
};

// Packs dense CPU planes (each [rows, cols], same dtype as the view) into `out`. The non-zero
// pattern is that of plane 0; other planes are sampled at the same positions. Routed rows take
// backup slots in order; if more rows route than out.shape.backup_capacity holds (and that
// capacity is not 0), throws Error naming "backup capacity" before writing anything to it.
PackResult pack_twell(const TensorView* planes, int num_planes, const TwellView& out);
// Convenience: allocates a matrix with exactly the backup rows it needs.
TwellMatrix pack_twell(const TensorView* planes, int num_planes, int32_t tile, int32_t capacity);

// Writes plane `plane` of `in` densely into `dense` [rows, cols] (zeros elsewhere). A routed row
// without a backup slot raises Error.
void unpack_twell(const TwellView& in, int plane, const TensorView& dense);

// Checks every invariant of docs/format.md (counts <= capacity, columns ascending and inside the
// matrix, routed list consistent with row_slot); throws Error describing the first violation.
void validate_twell(const TwellView& in);

// Column-major (per neuron) index of the stored non-zeros, for backward passes:
//   col_ptr [cols + 1], row [nnz], pos [nnz] where pos is the element offset of the value inside
//   plane 0 of `values` (compact rows) or, with bit 62 set, inside plane 0 of `backup`.
// Routed rows without a backup row raise Error unless `routed` is RoutedRows::skip.
enum class RoutedRows : uint8_t { include, skip };
struct ColumnIndex {
  std::vector<int64_t> col_ptr;
  std::vector<int32_t> row;
  std::vector<int64_t> pos;
  static constexpr int64_t kBackupBit = int64_t(1) << 62;
};
ColumnIndex build_column_index(const TwellView& in, RoutedRows routed = RoutedRows::include);

}  // namespace twell
