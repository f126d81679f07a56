#include "twell/dtype.hpp"

#include <cmath>

#include "twell/error.hpp"

namespace twell {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: case DType::u16: return 2;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u16: return "uint16";
    case DType::u8: return "uint8";
  }
  return "?";
}

bool is_float_dtype(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

float to_float(f16 v) {
  const uint32_t sign = uint32_t(v.bits & 0x8000u) << 16;
  const uint32_t exp = (v.bits >> 10) & 0x1fu;
  const uint32_t man = v.bits & 0x3ffu;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(float(man), -24);  // zero or subnormal
  } else if (exp == 31) {
    mag = man ? NAN : INFINITY;
  } else {
    mag = std::ldexp(float(man | 0x400u), int(exp) - 25);
  }
  uint32_t u;
  std::memcpy(&u, &mag, 4);
  u |= sign;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16 to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return f16{uint16_t(sign | 0x7e00u)};
  if (a >= 65520.0f) return f16{uint16_t(sign | 0x7c00u)};  // rounds to infinity
  if (a < 6.103515625e-05f) {                                // subnormal range: multiples of 2^-24
    const float q = std::nearbyint(std::ldexp(a, 24));       // ties to even (default rounding)
    return f16{uint16_t(sign | uint16_t(q))};
  }
  int e;
  const float m = std::frexp(a, &e);                   // a = m * 2^e, m in [0.5, 1)
  float q = std::nearbyint(std::ldexp(m, 11));         // 11 significant bits
  if (q == 2048.0f) { q = 1024.0f; ++e; }
  const uint32_t exp = uint32_t(e - 1 + 15);
  if (exp >= 31) return f16{uint16_t(sign | 0x7c00u)};
  return f16{uint16_t(sign | (exp << 10) | (uint32_t(q) & 0x3ffu))};
}

float load_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::bf16: return to_float(static_cast<const bf16*>(base)[i]);
    case DType::f16: return to_float(static_cast<const f16*>(base)[i]);
    default: throw Error("load_float", "dtype", "float32, float16 or bfloat16", dtype_name(t));
  }
}

void store_float(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = v; return;
    case DType::bf16: static_cast<bf16*>(base)[i] = to_bf16(v); return;
    case DType::f16: static_cast<f16*>(base)[i] = to_f16(v); return;
    default: throw Error("store_float", "dtype", "float32, float16 or bfloat16", dtype_name(t));
  }
}

float round_to(DType t, float v) {
  switch (t) {
    case DType::bf16: return to_float(to_bf16(v));
    case DType::f16: return to_float(to_f16(v));
    default: return v;
  }
}

}  // namespace twell
