// The warp-level tensor-core tile of the backend's mma.sync kernels: m16n8k16, 16-bit inputs,
// fp32 accumulators (sm_80 and newer). Fragments, lane l = 4 g + q:
//   a (row-major 16 x 16): a[0] = A(g, 2q..2q+1), a[1] = A(g + 8, 2q..), a[2] = A(g, 2q + 8..),
//                          a[3] = A(g + 8, 2q + 8..)
//   b (16 x 8, k-pairs):   b0 = B(2q..2q+1, g), b1 = B(2q + 8.., g)
//   c (16 x 8):            c[0..1] = C(g, 2q..2q+1), c[2..3] = C(g + 8, 2q..2q+1)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace twell::gpu {

// c += a b for one m16n8k16 tile.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace twell::gpu
