// The 16-bit element types of the CUDA kernels (bf16, fp16): float conversions and 16-byte
// vectors of eight values, plus the host switch from twell::DType to the CUDA type.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "twell/dtype.hpp"
#include "twell/error.hpp"

namespace twell::gpu {

constexpr int kVecElems = 8;                  // 16-bit values per 16-byte vector
constexpr uint32_t kMagnitudeBits = 0x7fffu;  // a 16-bit float is zero iff these bits are (+0 or -0)

template <typename T>
struct Elem;

template <>
struct Elem<__nv_bfloat16> {
  using Pair = __nv_bfloat162;
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ float2 to_float2(Pair p) { return __bfloat1622float2(p); }
  static __device__ __forceinline__ Pair from_float2(float2 f) { return __float22bfloat162_rn(f); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float f) { return __float2bfloat16_rn(f); }
};

template <>
struct Elem<__half> {
  using Pair = __half2;
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  static __device__ __forceinline__ float2 to_float2(Pair p) { return __half22float2(p); }
  static __device__ __forceinline__ Pair from_float2(float2 f) { return __float22half2_rn(f); }
  static __device__ __forceinline__ __half from_float(float f) { return __float2half_rn(f); }
};

// The eight values of a 16-byte vector as floats.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[kVecElems]) {
  const auto* pairs = reinterpret_cast<const typename Elem<T>::Pair*>(&v);
#pragma unroll
  for (int i = 0; i < kVecElems / 2; ++i) {
    const float2 p = Elem<T>::to_float2(pairs[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// Eight floats rounded (to nearest even) into a 16-byte vector.
template <typename T>
__device__ __forceinline__ uint4 pack8(const float (&f)[kVecElems]) {
  uint4 v;
  auto* pairs = reinterpret_cast<typename Elem<T>::Pair*>(&v);
#pragma unroll
  for (int i = 0; i < kVecElems / 2; ++i) pairs[i] = Elem<T>::from_float2(make_float2(f[2 * i], f[2 * i + 1]));
  return v;
}

// How many of the eight 16-bit floats of a vector are non-zero.
__device__ __forceinline__ int nonzero_count(const uint4& v) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  int n = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) n += int((words[i] & kMagnitudeBits) != 0) + int((words[i] >> 16 & kMagnitudeBits) != 0);
  return n;
}

// A 16-byte vector of data that stays constant during the kernel (weights, x, TwELL).
__device__ __forceinline__ uint4 load_readonly(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// Host: calls f(T{}) with T the CUDA element type of `t`; other dtypes raise Error.
template <typename F>
void with_element_type(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::bf16: f(__nv_bfloat16{}); return;
    case DType::f16: f(__half{}); return;
    default: throw Error(op, "dtype", "float16 or bfloat16", dtype_name(t));
  }
}

}  // namespace twell::gpu
