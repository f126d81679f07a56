#include "core/check.hpp"

namespace twell::detail {

namespace {

std::optional<Error> common_error(const char* op, const char* name, const TensorView& t, DType dt,
                                  Device dev) {
  if (t.dtype != dt) return Error(op, name, dtype_name(dt), dtype_name(t.dtype));
  if (t.device != dev) return Error(op, name, "device " + to_string(dev), to_string(t.device));
  if (!t.is_contiguous()) {
    std::string s = "[";
    for (int i = 0; i < t.rank; ++i) s += (i ? ", " : "") + std::to_string(t.stride[size_t(i)]);
    return Error(op, name, "a contiguous row-major tensor", "strides " + s + "]");
  }
  return std::nullopt;
}

}  // namespace

std::optional<Error> matrix_error(const char* op, const char* name, const TensorView& t,
                                  int64_t rows, int64_t cols, DType dt, Device dev) {
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
  if (!t.defined()) return Error(op, name, "a tensor", "none");
  if (t.rank != 1 || t.shape[0] != n)
    return Error(op, name, "[" + std::to_string(n) + "]", t.shape_string());
  return common_error(op, name, t, dt, dev);
}

}  // namespace twell::detail
