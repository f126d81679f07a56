#include "cpu/kernels.hpp"

#include <cfloat>
#include <cmath>
#include <cstring>

#include "twell/dtype.hpp"

#define TWELL_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

namespace twell::cpu {

namespace {

// A weight value as fp32: itself, or bfloat16 bits as the float they are the upper half of.
inline float widened(float v) { return v; }
inline float widened(uint16_t b) { return __builtin_bit_cast(float, uint32_t(b) << 16); }

// The loops of dot, axpy, dot2 and axpy2 over weight rows of type W, inlined into each clone.
template <typename W>
__attribute__((always_inline)) inline float dot_of(const float* x, const W* a, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i] * widened(a[i]);
  return s;
}

template <typename W>
__attribute__((always_inline)) inline void axpy_of(float alpha, const W* a, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * widened(a[i]);
}

template <typename W>
__attribute__((always_inline)) inline void dot2_of(const float* x, const W* a, const W* b, int64_t n,
                                                   float* da, float* db) {
  float sa = 0.0f, sb = 0.0f;
#pragma omp simd reduction(+ : sa, sb)
  for (int64_t i = 0; i < n; ++i) {
    sa += x[i] * widened(a[i]);
    sb += x[i] * widened(b[i]);
  }
  *da = sa;
  *db = sb;
}

template <typename W>
__attribute__((always_inline)) inline void axpy2_of(float alpha, const W* a, float beta, const W* b,
                                                    float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * widened(a[i]) + beta * widened(b[i]);
}

}  // namespace

TWELL_CLONES float dot(const float* a, const float* b, int64_t n) { return dot_of(a, b, n); }
TWELL_CLONES float dot(const float* x, const uint16_t* a, int64_t n) { return dot_of(x, a, n); }

TWELL_CLONES void axpy(float alpha, const float* x, float* y, int64_t n) { axpy_of(alpha, x, y, n); }
TWELL_CLONES void axpy(float alpha, const uint16_t* a, float* y, int64_t n) { axpy_of(alpha, a, y, n); }

TWELL_CLONES void dot2(const float* x, const float* a, const float* b, int64_t n, float* da,
                       float* db) {
  dot2_of(x, a, b, n, da, db);
}
TWELL_CLONES void dot2(const float* x, const uint16_t* a, const uint16_t* b, int64_t n, float* da,
                       float* db) {
  dot2_of(x, a, b, n, da, db);
}

TWELL_CLONES void axpy2(float alpha, const float* a, float beta, const float* b, float* y,
                        int64_t n) {
  axpy2_of(alpha, a, beta, b, y, n);
}
TWELL_CLONES void axpy2(float alpha, const uint16_t* a, float beta, const uint16_t* b, float* y,
                        int64_t n) {
  axpy2_of(alpha, a, beta, b, y, n);
}

TWELL_CLONES bool all_finite(const float* a, int64_t n) {
  int bad = 0;
#pragma omp simd reduction(| : bad)
  for (int64_t i = 0; i < n; ++i) bad |= !(std::fabs(a[i]) <= FLT_MAX);  // false for NaN and Inf
  return bad == 0;
}

namespace {

// relu_active on bits: a magnitude (the bits below the sign) that is non-zero, and either no sign
// bit or a magnitude above infinity's (NaN). Branch-free; inlined into each clone below. Counted
// in blocks with a counter as wide as the values (vector lanes of the values' width: no widening
// to 64 bits per element), which a block of 2^15 cannot overflow.
template <typename U>
__attribute__((always_inline)) inline int64_t count_active_bits(const U* v, int64_t n, U sign, U inf) {
  constexpr int64_t kBlock = int64_t(1) << 15;
  int64_t total = 0;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = begin + kBlock < n ? begin + kBlock : n;
    U c = 0;
#pragma omp simd reduction(+ : c)
    for (int64_t i = begin; i < end; ++i) {
      const U b = v[i], magnitude = U(b & U(~sign));
      c = U(c + U((magnitude != 0) & (((b & sign) == 0) | (magnitude > inf))));
    }
    total += c;
  }
  return total;
}

TWELL_CLONES int64_t count_active_32(const uint32_t* v, int64_t n) {
  return count_active_bits<uint32_t>(v, n, 0x80000000u, 0x7f800000u);
}

TWELL_CLONES int64_t count_active_16(const uint16_t* v, int64_t n, uint16_t inf) {
  return count_active_bits<uint16_t>(v, n, 0x8000, inf);
}

// bfloat16 is the upper half of a float32: a shift, vectorised.
TWELL_CLONES void bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = widened(src[i]);
}

// IEEE half to float: the compiler's _Float16 (F16C's vcvtph2ps in the x86-64-v3 and v4 clones).
TWELL_CLONES void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
#ifdef __FLT16_MAX__
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = float(__builtin_bit_cast(_Float16, src[i]));
#else
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(f16{src[i]});
#endif
}

}  // namespace

int64_t count_active(const void* values, DType t, int64_t n) {
  switch (t) {
    case DType::f32:
      return count_active_32(static_cast<const uint32_t*>(values), n);
    case DType::bf16:
      return count_active_16(static_cast<const uint16_t*>(values), n, 0x7f80);  // +Inf's bits
    case DType::f16:
      return count_active_16(static_cast<const uint16_t*>(values), n, 0x7c00);
    default:
      return -1;  // not a float dtype: the caller checked
  }
}

void to_f32(const void* src, DType t, float* dst, int64_t n) {
  if (n <= 0) return;  // an empty batch may come with null pointers
  switch (t) {
    case DType::f32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
    case DType::bf16: bf16_to_f32(static_cast<const uint16_t*>(src), dst, n); return;
    case DType::f16: f16_to_f32(static_cast<const uint16_t*>(src), dst, n); return;
    default:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_float(src, t, i);  // names the dtype it refuses
  }
}

void from_f32(const float* src, DType t, void* dst, int64_t n) {
  if (n <= 0) return;  // an empty batch may come with null pointers
  if (t == DType::f32) {
    std::memcpy(dst, src, size_t(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_float(dst, t, i, src[i]);
}

}  // namespace twell::cpu
