// DLPack arrays (nanobind ndarrays from numpy, PyTorch, ...) as twell views, zero copy.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>

#include "twell/tensor.hpp"

namespace twell::python {

namespace nb = nanobind;
using Array = nb::ndarray<>;

// View of `a` (any rank <= 4, any strides, CPU or CUDA). Throws twell::Error naming `name` for a
// dtype or device twell does not know.
TensorView to_view(const Array& a, const char* op, const char* name);

// A stream passed from Python as an integer (torch.cuda.current_stream().cuda_stream); 0 means
// cudaStreamPerThread inside twell.
inline void* to_stream(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

}  // namespace twell::python
