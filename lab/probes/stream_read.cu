// twell_stream_read: how fast one decoding step's gate can read W1 (N x K bf16, cold in L2), by
// access pattern. A CUDA graph of 8 kernels, each on its own copy of the matrix (as a decoding
// step runs its layers), replayed; the time per kernel is printed. Every byte read is folded into
// a per-thread XOR and written out, so nothing is optimised away. Not a harness row.
//   warp_rows      a warp per row, rows round robin over all resident warps, U loads in flight
//   cta_regs       one CTA per SM (512 threads) on a contiguous run of rows, U loads in flight
//   ring_parts     one CTA per SM, cp.async ring of S slots of 16 rows x 512 columns (16 KB)
//   ring_rows      one CTA per SM, cp.async ring of S slots of 4 whole rows (16 KB at K = 2048)
//   cublas_gemv    cublasGemmEx with M = 1 (the dense layer's GEMV), for reference
//     twell_stream_read [N] [K]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/kernels/common/cp_async.cuh"

using twell::gpu::cp_async_16;
using twell::gpu::cp_async_commit;

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

constexpr int kLayers = 8;

template <int U>
__global__ void warp_rows(const uint4* w, int64_t rows, int64_t vecs_per_row, uint32_t* out) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  uint32_t acc = 0;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const uint4* row = w + r * vecs_per_row;
    for (int64_t v = lane; v < vecs_per_row; v += 32 * U) {
      uint4 t[U];
#pragma unroll
      for (int u = 0; u < U; ++u) t[u] = v + u * 32 < vecs_per_row ? __ldg(row + v + u * 32) : uint4{};
#pragma unroll
      for (int u = 0; u < U; ++u) acc ^= t[u].x ^ t[u].y ^ t[u].z ^ t[u].w;
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template <int U>
__global__ void cta_regs(const uint4* w, int64_t total_vecs, uint32_t* out) {
  const int64_t per = (total_vecs + gridDim.x - 1) / gridDim.x;
  const int64_t first = blockIdx.x * per, last = min(total_vecs, first + per);
  uint32_t acc = 0;
  for (int64_t v = first + threadIdx.x; v < last; v += int64_t(blockDim.x) * U) {
    uint4 t[U];
#pragma unroll
    for (int u = 0; u < U; ++u) t[u] = v + u * blockDim.x < last ? __ldg(w + v + u * blockDim.x) : uint4{};
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= t[u].x ^ t[u].y ^ t[u].z ^ t[u].w;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// A cp.async ring; `parts`: stages of 16 rows x 512 columns (else 16 KB of whole rows).
template <int S>
__global__ void ring(const uint4* w, int64_t rows, int64_t vecs_per_row, bool parts, uint32_t* out) {
  extern __shared__ uint4 slots[];  // S x 1024 vectors
  const int64_t cta_rows = (rows + gridDim.x - 1) / gridDim.x;
  const int64_t r0 = blockIdx.x * cta_rows, r1 = min(rows, r0 + cta_rows);
  const int64_t nparts = parts ? vecs_per_row / 64 : 1;
  const int64_t stage_rows = parts ? 16 : 1024 / vecs_per_row;
  const int64_t stages = r1 > r0 ? (r1 - r0 + stage_rows - 1) / stage_rows * nparts : 0;
  auto issue = [&](int64_t s) {
    if (s < stages) {
      const int64_t first = r0 + s / nparts * stage_rows, p = s % nparts;
      uint4* slot = slots + (s % S) * 1024;
      for (int c = threadIdx.x; c < 1024; c += blockDim.x) {
        int64_t r, col;
        if (parts) {
          r = first + c / 64, col = p * 64 + c % 64;
        } else {
          r = first + c / vecs_per_row, col = c % vecs_per_row;
        }
        const bool ok = r < r1;
        cp_async_16(slot + c, ok ? w + r * vecs_per_row + col : w, ok);
      }
    }
    cp_async_commit();
  };
  for (int s = 0; s < S - 1; ++s) issue(s);
  uint32_t acc = 0;
  for (int64_t s = 0; s < stages; ++s) {
    twell::gpu::cp_async_wait<S - 2>();
    __syncthreads();
    issue(s + S - 1);
    const uint4* slot = slots + (s % S) * 1024;
    for (int c = threadIdx.x; c < 1024; c += blockDim.x) acc ^= slot[c].x ^ slot[c].y ^ slot[c].z ^ slot[c].w;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 5632, k = argc > 2 ? std::atoll(argv[2]) : 2048;
  const int64_t elems = n * k, vecs_per_row = k / 8, total_vecs = elems / 8;
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::vector<__nv_bfloat16*> w(kLayers);
  for (auto& p : w) {
    CHECK(cudaMalloc(&p, elems * 2));
    CHECK(cudaMemset(p, 1, elems * 2));
  }
  __nv_bfloat16 *x, *y;
  CHECK(cudaMalloc(&x, k * 2));
  CHECK(cudaMalloc(&y, n * 2 * kLayers));
  CHECK(cudaMemset(x, 0, k * 2));
  uint32_t* out;
  CHECK(cudaMalloc(&out, size_t(sms) * 64 * 1024 * 4));
  void* flush;
  const size_t flush_bytes = size_t(256) << 20;
  CHECK(cudaMalloc(&flush, flush_bytes));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t blas;
  cublasCreate(&blas);
  cublasSetStream(blas, s);
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const int ring_smem = 12 * 1024 * 16;
  CHECK(cudaFuncSetAttribute(ring<12>, cudaFuncAttributeMaxDynamicSharedMemorySize, ring_smem));
  CHECK(cudaFuncSetAttribute(ring<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 1024 * 16));

  auto time = [&](const char* name, auto&& layer) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < kLayers; ++l) layer(l);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    std::vector<float> ms;
    for (int rep = 0; rep < 12; ++rep) {
      CHECK(cudaMemsetAsync(flush, rep, flush_bytes, s));
      CHECK(cudaEventRecord(e0, s));
      CHECK(cudaGraphLaunch(ge, s));
      CHECK(cudaEventRecord(e1, s));
      CHECK(cudaEventSynchronize(e1));
      float t;
      CHECK(cudaEventElapsedTime(&t, e0, e1));
      if (rep >= 2) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double us = ms[ms.size() / 2] * 1000.0 / kLayers;
    std::printf("%-28s %7.2f us/layer  %6.2f TB/s\n", name, us, elems * 2 / us / 1e6);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  };
  auto wv = [&](int l) { return reinterpret_cast<const uint4*>(w[l]); };
  char name[64];
  for (int warps : {8, 16, 24, 32}) {
    std::snprintf(name, sizeof name, "warp_rows U=8 %d warps/SM", warps);
    time(name, [&](int l) { warp_rows<8><<<sms * warps / 8, 256, 0, s>>>(wv(l), n, vecs_per_row, out); });
  }
  for (int ctas : {1, 2, 4}) {
    std::snprintf(name, sizeof name, "cta_regs U=8 %d x 512/SM", ctas);
    time(name, [&](int l) { cta_regs<8><<<sms * ctas, 512, 0, s>>>(wv(l), total_vecs, out); });
    std::snprintf(name, sizeof name, "cta_regs U=4 %d x 512/SM", ctas);
    time(name, [&](int l) { cta_regs<4><<<sms * ctas, 512, 0, s>>>(wv(l), total_vecs, out); });
  }
  time("ring_parts S=12", [&](int l) { ring<12><<<sms, 512, ring_smem, s>>>(wv(l), n, vecs_per_row, true, out); });
  time("ring_rows S=12", [&](int l) { ring<12><<<sms, 512, ring_smem, s>>>(wv(l), n, vecs_per_row, false, out); });
  time("ring_parts S=4", [&](int l) { ring<4><<<sms, 512, 4 * 1024 * 16, s>>>(wv(l), n, vecs_per_row, true, out); });
  time("ring_rows S=4", [&](int l) { ring<4><<<sms, 512, 4 * 1024 * 16, s>>>(wv(l), n, vecs_per_row, false, out); });
  time("cublas_gemv (GemmEx M=1)", [&](int l) {
    const float one = 1.0f, zero = 0.0f;
    cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), 1, int(k), &one, w[l], CUDA_R_16BF, int(k), x, CUDA_R_16BF,
                 int(k), &zero, y + l * n, CUDA_R_16BF, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
  return 0;
}
