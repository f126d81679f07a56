#include "twell/tensor.hpp"

#include <string>

#include "twell/error.hpp"

namespace twell {

std::string to_string(Device d) {
  return d.type == DeviceType::cpu ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

TensorView TensorView::matrix(void* data, DType dt, int64_t rows, int64_t cols, Device dev) {
  TensorView t;
  t.data = data;
  t.dtype = dt;
  t.device = dev;
  t.rank = 2;
  t.shape = {rows, cols, 0, 0};
  t.stride = {cols, 1, 0, 0};
  return t;
}

TensorView TensorView::vector(void* data, DType dt, int64_t n, Device dev) {
  TensorView t;
  t.data = data;
  t.dtype = dt;
  t.device = dev;
  t.rank = 1;
  t.shape = {n, 0, 0, 0};
  t.stride = {1, 0, 0, 0};
  return t;
}

int64_t TensorView::numel() const {
  const char* op = "TensorView::numel";
  if (rank < 0 || rank > kMaxRank)
    throw Error(op, "rank", "0.." + std::to_string(kMaxRank), std::to_string(rank));
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    if (shape[size_t(i)] < 0) throw Error(op, "shape", "non-negative dimensions", shape_string());
    int64_t next;
    if (__builtin_mul_overflow(n, shape[size_t(i)], &next))
      throw Error(op, "shape", "at most 2^63 - 1 elements", shape_string() + " (overflow)");
    n = next;
  }
  return n;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // nothing is addressed: exporters give empty arrays any strides
  int64_t expect = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (shape[size_t(i)] != 1 && stride[size_t(i)] != expect) return false;
    expect *= shape[size_t(i)];
  }
  return true;
}

std::string TensorView::shape_string() const {
  if (rank < 0 || rank > kMaxRank) return "<rank " + std::to_string(rank) + ">";
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[size_t(i)]);
  }
  return s + "]";
}

}  // namespace twell
