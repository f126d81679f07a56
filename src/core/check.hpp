// Argument validation shared by every op: each check names the argument in a twell::Error.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "twell/error.hpp"
#include "twell/tensor.hpp"

namespace twell::detail {

// The problem with `t` as a contiguous [rows, cols] view of dtype `dt` on `dev` (rows < 0: any
// row count), or nothing when it fits.
std::optional<Error> matrix_error(const char* op, const char* name, const TensorView& t,
                                  int64_t rows, int64_t cols, DType dt, Device dev);
// The same for a contiguous vector [n].
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

}  // namespace twell::detail
