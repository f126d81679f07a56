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
#include <type_traits>
#include <vector>

#include "twell/error.hpp"
#include "twell/tensor.hpp"

namespace twell {

#if defined(__CUDACC__)
#define TWELL_HOST_DEVICE __host__ __device__
#else
#define TWELL_HOST_DEVICE
#endif

// Counts and tile-local columns are uint16: a tile holds at most 65536 columns (0..65535) and a
// (row, tile) at most 65535 entries.
inline constexpr int32_t kMaxTwellTile = 65536;
inline constexpr int32_t kMaxTwellCapacity = 65535;

struct TwellShape {
  int64_t rows = 0;
  int64_t cols = 0;            // N, the hidden width; the last tile is padded
  int32_t tile = 256;          // columns per tile, 1..kMaxTwellTile
  int32_t capacity = 32;       // entry slots per (row, tile), 1..min(tile, kMaxTwellCapacity)
  int32_t planes = 1;          // value planes sharing one index structure (2 for gated training)
  int64_t backup_capacity = 0; // dense backup rows available (0: routed rows are only listed)

  TWELL_HOST_DEVICE int64_t num_tiles() const { return tile > 0 ? cols / tile + (cols % tile != 0) : 0; }
  // num_tiles() * capacity; throws Error if that overflows int64.
  int64_t slots_per_row() const;
  // Throws Error naming the bad field, or the product that overflows when the single-buffer form
  // of this shape would not fit in 2^63 - 1 bytes (so every element count of a valid shape fits
  // in int64).
  void validate(const char* op) const;
  // Bytes of the single-buffer form (every array, 16-byte aligned; docs/format.md).
  size_t bytes(DType dtype) const;
};

// The last array of the single-buffer form: what the buffer holds, so that a consumer can tell a
// complete TwELL matrix of the expected shape from stale, foreign or corrupted bytes.
inline constexpr uint32_t kTwellMagic = 0x4c457754u;    // the bytes "TwEL" (little-endian)
inline constexpr uint16_t kTwellVersion = 1;
inline constexpr uint32_t kTwellWritten = 0x454e4f44u;  // the bytes "DONE": a writer finished
struct TwellHeader {
  uint32_t magic;            // kTwellMagic
  uint16_t version;          // kTwellVersion
  uint8_t dtype;             // the DType of the values, as its underlying value
  uint8_t planes;
  int32_t tile;
  int32_t capacity;
  int64_t rows;
  int64_t cols;
  int64_t backup_capacity;
  uint64_t owner;            // a tag the writer sets (e.g. a training plan's); 0: none
  uint32_t written;          // kTwellWritten once a writer finished a complete pack; 0 otherwise
  uint32_t reserved[3];      // zero
};
static_assert(sizeof(TwellHeader) == 64, "TwellHeader is 64 bytes (docs/format.md)");
static_assert(std::is_trivially_copyable_v<TwellHeader> && std::is_standard_layout_v<TwellHeader>,
              "TwellHeader is a plain byte record that device code and memcpy can write");

// The header a complete pack of `shape` in `dtype` writes (written = kTwellWritten, reserved 0);
// throws Error for an invalid shape.
TwellHeader make_twell_header(const TwellShape& shape, DType dtype, uint64_t owner);

// Whether validation compares the header's owner tag (OwnerCheck::match) or accepts any.
enum class OwnerCheck : uint8_t { any, match };
// Throws Error(op, "header <field>", ...) at the first field of `got` that differs from `want`
// (magic, version, dtype, planes, tile, capacity, rows, cols, backup_capacity, written, reserved;
// owner too under OwnerCheck::match).
void check_twell_header(const char* op, const TwellHeader& got, const TwellHeader& want,
                        OwnerCheck owner = OwnerCheck::any);

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
//   header      [1]                                  TwellHeader (null in a view made by hand)
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
  TwellHeader* header = nullptr;
};

// Carves a view out of one buffer of at least shape.bytes(dtype) bytes (order and alignment in
// docs/format.md), on any device: how frameworks hold a TwELL matrix as a single byte tensor. The
// buffer must be 16-byte aligned. The view's header points at the buffer's header array; nothing
// is read or written.
TwellView make_twell_view(void* buffer, const TwellShape& shape, DType dtype, Device device);

// Owning host (CPU) TwELL matrix: an empty one (every row compact with no entries) whose header
// is that of its shape with written = 0 until a pack fills it. Throws Error (argument "shape")
// when the memory cannot be allocated.
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
// capacity is not 0), throws Error naming "backup capacity" before writing anything to it. The
// header (when out.header is set) is marked unwritten first and written (owner 0) last.
PackResult pack_twell(const TensorView* planes, int num_planes, const TwellView& out);
// Convenience: allocates a matrix with exactly the backup rows it needs.
TwellMatrix pack_twell(const TensorView* planes, int num_planes, int32_t tile, int32_t capacity);

// Writes plane `plane` of `in` densely into `dense` [rows, cols] (zeros elsewhere). Checks the
// structure of `in` as validate_twell does (not its header) before reading any entry; a routed
// row without a backup slot raises Error.
void unpack_twell(const TwellView& in, int plane, const TensorView& dense);

// Checks every invariant of docs/format.md (arrays present, counts <= capacity, columns ascending
// and inside the matrix, routed list consistent with row_slot) and, when in.header is set, that
// the header is make_twell_header(in.shape, in.dtype, any owner); throws Error describing the
// first violation. The second form also requires a header whose owner tag is `owner`.
void validate_twell(const TwellView& in);
void validate_twell(const TwellView& in, uint64_t owner);

// Column-major (per neuron) index of the stored non-zeros, for backward passes:
//   col_ptr [cols + 1], row [nnz], pos [nnz] where pos is the element offset of the value inside
//   plane 0 of `values` (compact rows) or, with bit 62 set, inside plane 0 of `backup`.
// Routed rows without a backup row raise Error unless `routed` is RoutedRows::skip. Checks the
// structure of `in` as unpack_twell does before reading any entry.
enum class RoutedRows : uint8_t { include, skip };
struct ColumnIndex {
  std::vector<int64_t> col_ptr;
  std::vector<int32_t> row;
  std::vector<int64_t> pos;
  static constexpr int64_t kBackupBit = int64_t(1) << 62;
};
ColumnIndex build_column_index(const TwellView& in, RoutedRows routed = RoutedRows::include);

}  // namespace twell
