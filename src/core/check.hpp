// Argument validation shared by every op: each check names the argument in a twell::Error.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "twell/error.hpp"
#include "twell/format.hpp"
#include "twell/tensor.hpp"

namespace twell::detail {

// The problem with `t`'s rank (0..TensorView::kMaxRank) or a negative dimension, or nothing.
std::optional<Error> shape_error(const char* op, const char* name, const TensorView& t);

// An Error when `p` is not a multiple of `align` bytes (the alignment a typed read of it needs),
// or nothing.
std::optional<Error> alignment_error(const char* op, const char* name, const void* p, size_t align);
inline void check_alignment(const char* op, const char* name, const void* p, size_t align) {
  if (auto e = alignment_error(op, name, p, align)) throw *e;
}

// The problem with `t` as a contiguous view of dtype `dt` on `dev` (any rank and shape), its data
// aligned to its element size, or nothing.
std::optional<Error> layout_error(const char* op, const char* name, const TensorView& t, DType dt,
                                  Device dev);

// The problem with `t` as a contiguous [rows, cols] view of dtype `dt` on `dev`, its data aligned
// to its element size (rows < 0: any row count), or nothing when it fits.
std::optional<Error> matrix_error(const char* op, const char* name, const TensorView& t,
                                  int64_t rows, int64_t cols, DType dt, Device dev);
// The same for a contiguous, aligned vector [n].
std::optional<Error> vector_error(const char* op, const char* name, const TensorView& t, int64_t n,
                                  DType dt, Device dev);

inline void check_matrix(const char* op, const char* name, const TensorView& t, int64_t rows,
                         int64_t cols, DType dt, Device dev) {
  if (auto e = matrix_error(op, name, t, rows, cols, dt, dev)) throw *e;
}
inline void check_vector(const char* op, const char* name, const TensorView& t, int64_t n, DType dt,
                         Device dev) {
  if (auto e = vector_error(op, name, t, n, dt, dev)) throw *e;
}
// A caller's workspace starts at a multiple of this many bytes (the backends carve typed arrays
// out of it).
inline constexpr size_t kWorkspaceAlign = 16;

// A workspace size asked for `rows` rows: at least 0.
inline void check_workspace_rows(const char* op, int64_t rows) {
  if (rows < 0) throw Error(op, "rows", ">= 0", std::to_string(rows));
}

// The bytes [begin, end) an argument addresses on its device; begin == end when it addresses none.
struct ByteRange {
  const char* name = "";  // a string literal
  Device device{};
  uintptr_t begin = 0, end = 0;
};

// The extent of a view from its shape, strides and dtype (an undefined view or one with no
// elements addresses nothing). Throws Error naming `name` when the shape is invalid or the extent
// does not fit the address space.
ByteRange byte_range(const char* op, const char* name, const TensorView& t);
// `bytes` bytes from `p` (null or 0 bytes: nothing).
ByteRange byte_range(const char* op, const char* name, const void* p, size_t bytes, Device dev);
// Every array of a saved TwELL view ("saved values", "saved cols", ... "saved header"), sized from
// its shape and dtype.
std::vector<ByteRange> saved_byte_ranges(const char* op, const TwellView& v);

// The first output that shares a byte with an input, or with another output, on the same device:
// Error(op, output, "no overlap with <other>", the two byte ranges). Nothing when all are disjoint.
std::optional<Error> overlap_error(const char* op, const std::vector<ByteRange>& outputs,
                                   const std::vector<ByteRange>& inputs);
inline void check_no_overlap(const char* op, const std::vector<ByteRange>& outputs,
                             const std::vector<ByteRange>& inputs) {
  if (auto e = overlap_error(op, outputs, inputs)) throw *e;
}

}  // namespace twell::detail
