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
  static constexpr uint16_t kInfBits = 0x7f80;  // +Inf; a magnitude above it is NaN
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ float2 to_float2(Pair p) { return __bfloat1622float2(p); }
  static __device__ __forceinline__ Pair from_float2(float2 f) { return __float22bfloat162_rn(f); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float f) { return __float2bfloat16_rn(f); }
};

template <>
struct Elem<__half> {
  using Pair = __half2;
  static constexpr uint16_t kInfBits = 0x7c00;
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

// The ReLU as torch.relu computes it: NaN stays NaN (NaN <= 0 is false); every other value <= 0,
// -0 and -Inf included, gives +0 (fmaxf(g, 0) would give 0 for NaN). A gate value is active
// (packed, ReLU derivative 1) when it is not <= 0: positive or NaN.
__host__ __device__ __forceinline__ bool relu_active(float g) { return !(g <= 0.0f); }
__host__ __device__ __forceinline__ float relu(float g) { return relu_active(g) ? g : 0.0f; }

constexpr uint16_t kSignBit = 0x8000;  // of a 16-bit float

// relu_active on the bits of a 16-bit float (inf_bits: Elem<T>::kInfBits): positive and non-zero,
// or NaN.
__host__ __device__ __forceinline__ bool relu_active_bits(uint16_t bits, uint16_t inf_bits) {
  const uint32_t magnitude = bits & kMagnitudeBits;
  return magnitude != 0 && (!(bits & kSignBit) || magnitude > inf_bits);
}
// NaN or infinite.
__host__ __device__ __forceinline__ bool nonfinite_bits(uint16_t bits, uint16_t inf_bits) {
  return (bits & kMagnitudeBits) >= inf_bits;
}
// -Inf, and the quiet NaN (the exponent bits of Inf and the top mantissa bit).
__host__ __device__ constexpr uint16_t negative_inf_bits(uint16_t inf_bits) {
  return uint16_t(inf_bits | kSignBit);
}
__host__ __device__ constexpr uint16_t quiet_nan_bits(uint16_t inf_bits) {
  return uint16_t(inf_bits | inf_bits >> 1);
}

// Whether any of the eight 16-bit floats of a vector is NaN or infinite: per 16-bit half,
// magnitude + (0x8000 - Inf) carries into bit 15 exactly when the magnitude is at least Inf's
// (no carry crosses into the other half).
template <typename T>
__device__ __forceinline__ bool any_nonfinite(const uint4& v) {
  constexpr uint32_t kBoth = 0x00010001u;  // a 16-bit constant in both halves of a word
  constexpr uint32_t kAdd = (kSignBit - Elem<T>::kInfBits) * kBoth;
  constexpr uint32_t kHalves = kMagnitudeBits * kBoth;
  const uint32_t hit = ((v.x & kHalves) + kAdd) | ((v.y & kHalves) + kAdd) | ((v.z & kHalves) + kAdd) |
                       ((v.w & kHalves) + kAdd);
  return (hit & kSignBit * kBoth) != 0;
}

// How many of the eight 16-bit floats of a vector are relu_active (positive or NaN).
template <typename T>
__device__ __forceinline__ int active_count(const uint4& v) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  int n = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    n += int(relu_active_bits(uint16_t(words[i]), Elem<T>::kInfBits)) +
         int(relu_active_bits(uint16_t(words[i] >> 16), Elem<T>::kInfBits));
  return n;
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
