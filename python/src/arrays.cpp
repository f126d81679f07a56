#include "arrays.hpp"

#include <string>

#include "twell/error.hpp"

namespace twell::python {

namespace {

namespace dl = nb::dlpack;

std::string dlpack_name(dl::dtype t) {
  const char* code = nullptr;
  switch (dl::dtype_code(t.code)) {
    case dl::dtype_code::Int: code = "int"; break;
    case dl::dtype_code::UInt: code = "uint"; break;
    case dl::dtype_code::Float: code = "float"; break;
    case dl::dtype_code::Bfloat: code = "bfloat"; break;
    case dl::dtype_code::Bool: code = "bool"; break;
    default: return "DLPack type code " + std::to_string(t.code) + " (" + std::to_string(t.bits) + " bits)";
  }
  std::string s = code + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

DType to_dtype(dl::dtype t, const char* op, const char* name) {
  using C = dl::dtype_code;
  if (t.lanes == 1) {
    switch (C(t.code)) {
      case C::Float:
        if (t.bits == 32) return DType::f32;
        if (t.bits == 16) return DType::f16;
        break;
      case C::Bfloat:
        if (t.bits == 16) return DType::bf16;
        break;
      case C::Int:
        if (t.bits == 32) return DType::i32;
        if (t.bits == 64) return DType::i64;
        break;
      case C::UInt:
        if (t.bits == 16) return DType::u16;
        if (t.bits == 8) return DType::u8;
        break;
      default: break;
    }
  }
  throw Error(op, name, "float32, float16, bfloat16, int32, int64, uint16 or uint8",
              dlpack_name(t));
}

Device to_device(const Array& a, const char* op, const char* name) {
  if (a.device_type() == nb::device::cpu::value) return Device::cpu();
  if (a.device_type() == nb::device::cuda::value) return Device::cuda(a.device_id());
  throw Error(op, name, "a CPU or CUDA array", "DLPack device type " + std::to_string(a.device_type()));
}

}  // namespace

TensorView to_view(const Array& a, const char* op, const char* name) {
  TensorView v;
  if (a.ndim() > size_t(TensorView::kMaxRank))
    throw Error(op, name, "at most " + std::to_string(TensorView::kMaxRank) + " dimensions",
                std::to_string(a.ndim()) + " dimensions");
  v.data = a.data();
  v.dtype = to_dtype(a.dtype(), op, name);
  v.device = to_device(a, op, name);
  v.rank = int(a.ndim());
  int64_t contiguous = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.shape[size_t(i)] = int64_t(a.shape(size_t(i)));
    v.stride[size_t(i)] = a.stride_ptr() ? a.stride(size_t(i)) : contiguous;
    contiguous *= v.shape[size_t(i)];
  }
  return v;
}

}  // namespace twell::python
