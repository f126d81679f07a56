// The elementwise passes of the training benchmark's dense baseline (training_dense.hpp), for bf16
// and fp16 storage with fp32 math. Memory-bound: each thread handles V consecutive columns of one
// row with 16-byte loads and stores where N allows (N % 8 == 0; cudaMalloc'd bases), else V = 1.
// Every 16-byte vector is stored by one st.global.v4 (store_vec): left to the compiler, the
// backward pass's du vector came out as eight 2-byte stores and ran at well under the DRAM
// bandwidth (lab/journal.md, "Tuned constants").
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "training_dense.hpp"
#include "training_dense_cuda.hpp"
#include "twell/error.hpp"

namespace twell::bench {
namespace {

__device__ inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float to_f(__half v) { return __half2float(v); }
template <typename T>
__device__ inline T from_f(float v);
template <>
__device__ inline __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
__device__ inline __half from_f<__half>(float v) { return __float2half(v); }

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename T, int V>
__device__ inline Vec<T, V>* at(T* base, int64_t offset) {
  return reinterpret_cast<Vec<T, V>*>(base + offset);
}
template <typename T, int V>
__device__ inline const Vec<T, V>* at(const T* base, int64_t offset) {
  return reinterpret_cast<const Vec<T, V>*>(base + offset);
}

__device__ inline uint32_t bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ inline uint32_t bits(__half v) { return __half_as_ushort(v); }

template <typename T, int V>
__device__ inline void store_vec(Vec<T, V>* p, const Vec<T, V>& v) {
  if constexpr (sizeof(Vec<T, V>) == 16) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = bits(v.v[2 * i]) | bits(v.v[2 * i + 1]) << 16;
    // Through the st.global.wb intrinsic (the default policy): nvcc 13.0 split a plain uint4 store
    // of du into 32-bit stores.
    __stwb(reinterpret_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
  } else {
    *p = v;
  }
}

// gu = [G | U] [M, 2N]: G <- relu(G) in place; h [M, N] = round(relu(G) * U); stats[0] += the
// count of relu(G) > 0 and stats[1] += sum |h| (the L0 and L1 numerators a training step reports,
// as twell's forward does: one atomic each per CTA).
template <typename T, int V>
__global__ void dense_forward_kernel(T* __restrict__ gu, T* __restrict__ h, int64_t m, int64_t n,
                                     DenseForwardStats* __restrict__ stats) {
  const int64_t per_row = n / V, items = m * per_row;
  unsigned long long active = 0;
  float l1 = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i - r * per_row) * V;
    Vec<T, V> g = *at<T, V>(gu, r * 2 * n + c);
    const Vec<T, V> u = *at<T, V>(gu, r * 2 * n + n + c);
    Vec<T, V> hv;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float gr = dense_relu(to_f(g.v[e]));
      g.v[e] = from_f<T>(gr);
      hv.v[e] = from_f<T>(gr * to_f(u.v[e]));
      active += gr > 0.0f;
      l1 += fabsf(to_f(hv.v[e]));
    }
    store_vec(at<T, V>(gu, r * 2 * n + c), g);
    store_vec(at<T, V>(h, r * n + c), hv);
  }
  __shared__ unsigned long long cta_active;
  __shared__ float cta_l1;
  if (threadIdx.x == 0) cta_active = 0, cta_l1 = 0.0f;
  __syncthreads();
  for (int d = 16; d > 0; d >>= 1) {
    active += __shfl_xor_sync(0xffffffffu, active, d);
    l1 += __shfl_xor_sync(0xffffffffu, l1, d);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&cta_active, active);
    atomicAdd(&cta_l1, l1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(&stats->active, cta_active);
    atomicAdd(&stats->l1, cta_l1);
  }
}

// d [M, 2N] holds dh in its left half: d <- [dg | du]; h [M, N] <- round(relu(G) * U) again.
template <typename T, int V>
__global__ void dense_backward_kernel(T* __restrict__ d, T* __restrict__ h, const T* __restrict__ gu,
                                      int64_t m, int64_t n, float l1_over_m) {
  const int64_t per_row = n / V, items = m * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i - r * per_row) * V;
    const Vec<T, V> dh = *at<T, V>(d, r * 2 * n + c);
    const Vec<T, V> g = *at<T, V>(gu, r * 2 * n + c);
    const Vec<T, V> u = *at<T, V>(gu, r * 2 * n + n + c);
    Vec<T, V> dg, du, hv;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float gr = to_f(g.v[e]), uf = to_f(u.v[e]);
      hv.v[e] = from_f<T>(gr * uf);
      float dgf, duf;
      dense_backward_element(to_f(dh.v[e]), gr, uf, to_f(hv.v[e]), l1_over_m, dgf, duf);
      dg.v[e] = from_f<T>(dgf);
      du.v[e] = from_f<T>(duf);
    }
    store_vec(at<T, V>(d, r * 2 * n + c), dg);
    store_vec(at<T, V>(d, r * 2 * n + n + c), du);
    store_vec(at<T, V>(h, r * n + c), hv);
  }
}

constexpr int kThreads = 256;

unsigned blocks_for(int64_t items) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, 1 << 16)));
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error("bench dense training", what, "a launch", cudaGetErrorString(e));
}

template <typename T>
void forward_t(void* gu, void* h, int64_t m, int64_t n, DenseForwardStats* stats, cudaStream_t s) {
  T* g = static_cast<T*>(gu);
  T* hp = static_cast<T*>(h);
  if (n % 8 == 0)
    dense_forward_kernel<T, 8><<<blocks_for(m * n / 8), kThreads, 0, s>>>(g, hp, m, n, stats);
  else
    dense_forward_kernel<T, 1><<<blocks_for(m * n), kThreads, 0, s>>>(g, hp, m, n, stats);
}

template <typename T>
void backward_t(void* d, void* h, const void* gu, int64_t m, int64_t n, float l1m, cudaStream_t s) {
  if (n % 8 == 0)
    dense_backward_kernel<T, 8><<<blocks_for(m * n / 8), kThreads, 0, s>>>(
        static_cast<T*>(d), static_cast<T*>(h), static_cast<const T*>(gu), m, n, l1m);
  else
    dense_backward_kernel<T, 1><<<blocks_for(m * n), kThreads, 0, s>>>(
        static_cast<T*>(d), static_cast<T*>(h), static_cast<const T*>(gu), m, n, l1m);
}

}  // namespace

void launch_dense_forward_elementwise(void* gu, void* h, int64_t m, int64_t n, DenseForwardStats* stats,
                                      DType t, void* stream) {
  if (m == 0 || n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (const cudaError_t e = cudaMemsetAsync(stats, 0, sizeof *stats, s); e != cudaSuccess)
    throw Error("bench dense training", "forward statistics", "a memset", cudaGetErrorString(e));
  if (t == DType::bf16)
    forward_t<__nv_bfloat16>(gu, h, m, n, stats, s);
  else if (t == DType::f16)
    forward_t<__half>(gu, h, m, n, stats, s);
  else throw Error("bench dense training", "dtype", "bfloat16 or float16", dtype_name(t));
  check_launch("forward elementwise");
}

void launch_dense_backward_elementwise(void* d, void* h, const void* gu, int64_t m, int64_t n,
                                       float l1_over_m, DType t, void* stream) {
  if (m == 0 || n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (t == DType::bf16) backward_t<__nv_bfloat16>(d, h, gu, m, n, l1_over_m, s);
  else if (t == DType::f16) backward_t<__half>(d, h, gu, m, n, l1_over_m, s);
  else throw Error("bench dense training", "dtype", "bfloat16 or float16", dtype_name(t));
  check_launch("backward elementwise");
}

}  // namespace twell::bench
