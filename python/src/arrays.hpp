// DLPack arrays (nanobind ndarrays from numpy, PyTorch, ...) as twell views, zero copy. Every array
// argument of every binding goes through to_arg: the one place where a Python object becomes a
// view, with the checks that do not depend on the op (the plans then check shape, dtype, device,
// contiguity, size and overlap).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

#include "twell/tensor.hpp"

namespace twell::python {

namespace nb = nanobind;

// What the library does with an argument's memory: reads it only, or writes it (then a read-only
// array, e.g. numpy's writeable=False, is refused).
enum class Access : uint8_t { read, write };

// An array argument as a view, with the nanobind array that keeps its memory alive while the view
// is used (a DLPack capsule hands ownership of its tensor to that array). None gives an undefined
// view (data null, rank 0).
struct ArrayArg {
  TensorView view;
  nb::ndarray<nb::ro> owner;
};

// `obj` as a view. Throws twell::Error naming `name` when obj is not an array (neither DLPack nor
// the buffer protocol), has more than TensorView::kMaxRank dimensions, a dtype or device twell
// does not know (the dtype error says `dtypes`, what this argument accepts), a negative extent
// or stride, an element count or byte span that int64 cannot hold, no memory behind a non-empty
// shape, or is read-only where `access` is write. Zero copy: strides are kept as they are, for
// the plans to refuse.
ArrayArg to_arg(nb::handle obj, const char* op, const char* name, Access access, const std::string& dtypes);

// A caller's byte buffer (a workspace): to_arg's checks, then a contiguous uint8 vector on
// `device`. Returns its view (shape[0] bytes at data).
TensorView byte_buffer(const ArrayArg& a, const char* op, const char* name, Device device);

// A stream passed from Python as an integer (torch.cuda.current_stream().cuda_stream); 0 means
// cudaStreamPerThread inside twell.
inline void* to_stream(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

}  // namespace twell::python
