#include "arrays.hpp"

#include <string>

#include "twell/error.hpp"

namespace twell::python {

namespace {

namespace dl = nb::dlpack;
using ReadOnlyArray = nb::ndarray<nb::ro>;

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

DType to_dtype(dl::dtype t, const char* op, const char* name, const std::string& dtypes) {
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
  throw Error(op, name, dtypes, dlpack_name(t));
}

Device to_device(const ReadOnlyArray& a, const char* op, const char* name) {
  if (a.device_type() == nb::device::cpu::value) return Device::cpu();
  if (a.device_type() == nb::device::cuda::value) return Device::cuda(a.device_id());
  throw Error(op, name, "a CPU or CUDA array", "DLPack device type " + std::to_string(a.device_type()));
}

std::string list_string(const int64_t* values, int rank) {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s + "]";
}

// The array behind `obj`, zero copy (no dtype or layout conversion is asked for). A writable one
// where the op writes; else a read-only one is accepted too.
ReadOnlyArray import_array(nb::handle obj, const char* op, const char* name, Access access) {
  ReadOnlyArray out;
  if (access == Access::write) {
    nb::ndarray<> writable;
    if (nb::try_cast(obj, writable, false)) return ReadOnlyArray(writable);
    if (nb::try_cast(obj, out, false))
      throw Error(op, name, "a writable array", "a read-only array");
  } else if (nb::try_cast(obj, out, false)) {
    return out;
  }
  throw Error(op, name, "an array (DLPack or the buffer protocol: numpy, PyTorch, ...)",
              nb::type_name(obj.type()).c_str());
}

// Extents and strides (elements) of `a` into `v`, checked: no negative extent, an element count
// int64 holds, no negative stride on a dimension of more than one element, and a byte span (from
// the first element to one past the last) that int64 holds.
void set_layout(const ReadOnlyArray& a, TensorView& v, const char* op, const char* name) {
  const int64_t* shape = a.shape_ptr();
  const int64_t* stride = a.stride_ptr();
  auto strides = [&v] { return "strides " + list_string(v.stride.data(), v.rank); };
  int64_t numel = 1;
  for (int i = 0; i < v.rank; ++i) {
    if (shape[i] < 0) throw Error(op, name, "non-negative extents", list_string(shape, v.rank));
    if (__builtin_mul_overflow(numel, shape[i], &numel))
      throw Error(op, name, "an element count int64 can hold", list_string(shape, v.rank));
  }
  int64_t contiguous = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.shape[size_t(i)] = shape[i];
    v.stride[size_t(i)] = stride ? stride[i] : contiguous;
    // Overflows only beside a zero extent: an empty array addresses nothing, any stride will do.
    if (__builtin_mul_overflow(contiguous, shape[i], &contiguous)) contiguous = 0;
  }
  if (numel == 0) return;
  int64_t last = 0;  // element offset of the last element
  for (int i = 0; i < v.rank; ++i) {
    const int64_t extent = v.shape[size_t(i)], step = v.stride[size_t(i)];
    if (extent == 1) continue;
    if (step < 0) throw Error(op, name, "non-negative strides", strides());
    int64_t reach = 0;
    if (__builtin_mul_overflow(extent - 1, step, &reach) ||
        __builtin_add_overflow(last, reach, &last))
      throw Error(op, name, "a byte span int64 can hold", strides());
  }
  int64_t span = 0;
  if (__builtin_add_overflow(last, int64_t(1), &span) ||
      __builtin_mul_overflow(span, int64_t(dtype_size(v.dtype)), &span))
    throw Error(op, name, "a byte span int64 can hold", strides());
  if (v.data == nullptr) throw Error(op, name, "memory behind a non-empty array", "a null pointer");
}

}  // namespace

ArrayArg to_arg(nb::handle obj, const char* op, const char* name, Access access, const std::string& dtypes) {
  ArrayArg out;
  if (obj.is_none()) return out;
  out.owner = import_array(obj, op, name, access);
  const ReadOnlyArray& a = out.owner;
  TensorView& v = out.view;
  if (a.ndim() > size_t(TensorView::kMaxRank))
    throw Error(op, name, "at most " + std::to_string(TensorView::kMaxRank) + " dimensions",
                std::to_string(a.ndim()) + " dimensions");
  v.data = const_cast<void*>(a.data());
  v.dtype = to_dtype(a.dtype(), op, name, dtypes);
  v.device = to_device(a, op, name);
  v.rank = int(a.ndim());
  set_layout(a, v, op, name);
  return out;
}

TensorView byte_buffer(const ArrayArg& a, const char* op, const char* name, Device device) {
  const TensorView& v = a.view;
  if (!a.owner.is_valid()) throw Error(op, name, "a contiguous uint8 vector", "none");
  if (v.dtype != DType::u8 || v.rank != 1 || !v.is_contiguous())
    throw Error(op, name, "a contiguous uint8 vector",
                std::string(dtype_name(v.dtype)) + " " + v.shape_string() + ", strides " +
                    list_string(v.stride.data(), v.rank));
  if (v.device != device) throw Error(op, name, "device " + to_string(device), to_string(v.device));
  return v;
}

}  // namespace twell::python
