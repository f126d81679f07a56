// Element types and host-side conversions for the 16-bit float formats.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace twell {

enum class DType : uint8_t { f32, f16, bf16, i32, i64, u16, u8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// True for the types an FFN computes in (f32, f16, bf16).
bool is_float_dtype(DType t);

// Host-side storage types for the 16-bit floats; bit patterns, no arithmetic.
struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };

inline float to_float(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even; NaN stays NaN.
inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}
float to_float(f16 v);
f16 to_f16(float f);

// Value of element i of a float buffer of type t, as float / written from float.
float load_float(const void* base, DType t, int64_t i);
void store_float(void* base, DType t, int64_t i, float v);
// Rounds v to what type t can hold (identity for f32).
float round_to(DType t, float v);

}  // namespace twell
