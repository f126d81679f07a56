// Vector kernels of the CPU backend (multi-versioned for AVX-512, AVX2+FMA and baseline x86-64).
#pragma once
#include <cstdint>

#include "twell/dtype.hpp"

namespace twell::cpu {

float dot(const float* a, const float* b, int64_t n);
// y += alpha * x
void axpy(float alpha, const float* x, float* y, int64_t n);
// Two rows at once (more loads in flight): returns dot(x, a) and dot(x, b).
void dot2(const float* x, const float* a, const float* b, int64_t n, float* da, float* db);
// y += alpha * a + beta * b
void axpy2(float alpha, const float* a, float beta, const float* b, float* y, int64_t n);

// The same four on bfloat16 weight rows (a, b: their bits), each value widened in registers as it
// is read: the same products and sums as on the rows widened first.
float dot(const float* x, const uint16_t* a, int64_t n);
void axpy(float alpha, const uint16_t* a, float* y, int64_t n);
void dot2(const float* x, const uint16_t* a, const uint16_t* b, int64_t n, float* da, float* db);
void axpy2(float alpha, const uint16_t* a, float beta, const uint16_t* b, float* y, int64_t n);

// Whether none of the n values is NaN or infinite.
bool all_finite(const float* a, int64_t n);

// The ReLU as torch.relu computes it: NaN stays NaN (NaN <= 0 is false); every other value <= 0,
// -0 and -Inf included, gives +0. A gate value is active (packed, ReLU derivative 1) when it is
// not <= 0: positive or NaN.
inline bool relu_active(float g) { return !(g <= 0.0f); }
inline float relu(float g) { return relu_active(g) ? g : 0.0f; }

// How many of the n values (float32, float16 or bfloat16 at `values`) relu_active holds for,
// counted on their bits: positive and non-zero, or NaN of either sign.
int64_t count_active(const void* values, DType t, int64_t n);

// Converts n elements of a float buffer of dtype t to fp32 (memcpy for f32).
void to_f32(const void* src, DType t, float* dst, int64_t n);
void from_f32(const float* src, DType t, void* dst, int64_t n);

}  // namespace twell::cpu
