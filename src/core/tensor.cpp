#include "twell/tensor.hpp"

#include <string>

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
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[size_t(i)];
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
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[size_t(i)]);
  }
  return s + "]";
}

}  // namespace twell
