// A base for classes that own a handle (a CUDA event, a cuBLAS handle, device memory): copying
// one would free the handle twice, so copies are deleted.
#pragma once

namespace twell::gpu {

class NoCopy {
 protected:
  NoCopy() = default;
  ~NoCopy() = default;

 public:
  NoCopy(const NoCopy&) = delete;
  NoCopy& operator=(const NoCopy&) = delete;
};

}  // namespace twell::gpu
