// bfloat16 GEMMs on the CPU's bf16 units through oneDNN (Debian's libdnnl), where the build has
// it: OpenBLAS has no bf16 GEMM, so without it 16-bit weights are widened to fp32 first.
#pragma once
#include <cstdint>

namespace twell::cpu {

// Whether gemm_nt_bf16 can run here: the build has oneDNN and its bf16 matmul on this CPU is a
// tuned kernel (AMX, AVX512-BF16), not its reference code (slower than widening). Decided once.
bool bf16_gemm_available();

// c[m, n] (fp32, row-major, rows ldc apart) = a[m, k] * b[n, k]^T, a and b bfloat16 row-major.
// On the calling thread's OpenMP team. Like the CPU's bf16 instructions, it treats subnormal
// inputs as zero and flushes subnormal products and sums (bf16_gate_guard puts that right).
// False (c untouched) where bf16_gemm_available() is false or oneDNN refused the problem.
bool gemm_nt_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b, float* c,
                  int64_t ldc);

// After gemm_nt_bf16 gave g[rows, n] = x w^T: puts right what its flushing could have changed,
// from x widened to fp32 (xf, [rows, k]) and w's bf16 rows. A row of x holding a subnormal value
// is computed again whole (exactly as the fp32 path does); in any other row each value of g is
// off by at most 2^-126 (sum |x| + 2k) (subnormal weights read as zero, subnormal products and
// partial sums flushed), so a value within 2^24 times that of zero is computed again, from x and
// its weight row widened. Runs on the caller's team; returns the values it computed again.
int64_t bf16_gate_guard(int64_t rows, int64_t n, int64_t k, const float* xf, const uint16_t* w,
                        float* g);

}  // namespace twell::cpu
