// The first C rows of a routed list through cuBLAS(Lt): gathered into dense [C, width] buffers,
// multiplied by cuBLAS, the results scattered back. C (RoutedBlasConfig) is chosen on the host
// from earlier runs; the count R exists only on the device, so the kernels zero-fill the buffer
// rows past R and write back only rows below min(C, R). Rows past C take routed_gemm.cu.
//   CTA: kThreads threads over a grid-stride range of 16-byte vectors (kCtasPerSm CTAs per SM).
//   thread: one vector per step; the list entry is read once per vector (an L1 hit).
#include <algorithm>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/inference.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"
#include "cuda/runtime/lt_gemm.hpp"

namespace twell::gpu {

namespace {

constexpr int kThreads = ElementwiseConfig::kThreads;

__device__ __forceinline__ int64_t listed(const RowList& l) { return min(l.cap, int64_t(*l.count)); }

// dst[i] = src[list[i]] for i < min(cap, R); zeros for i in [R, cap).
__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const uint4* __restrict__ src, int64_t vectors_per_row, RowList l, uint4* dst) {
  chain_entry();
  const int64_t live = listed(l);
  const int64_t total = l.cap * vectors_per_row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += stride) {
    const int64_t i = v / vectors_per_row, c = v % vectors_per_row;
    dst[v] = i < live ? src[int64_t(l.list[i]) * vectors_per_row + c] : make_uint4(0, 0, 0, 0);
  }
}

// h = g * u (exact in fp32, rounded once) for i < min(cap, R): into u[i] and hidden[list[i]].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    routed_product_kernel(T* hidden, int64_t vectors_per_row, RowList l, T* up) {
  chain_entry();
  const int64_t total = listed(l) * vectors_per_row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += stride) {
    const int64_t i = v / vectors_per_row, c = v % vectors_per_row;
    auto* g_at = reinterpret_cast<uint4*>(hidden + (int64_t(l.list[i]) * vectors_per_row + c) * kVecElems);
    auto* u_at = reinterpret_cast<uint4*>(up + v * kVecElems);
    float g[kVecElems], u[kVecElems];
    unpack8<T>(*g_at, g);
    unpack8<T>(*u_at, u);
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) g[e] *= u[e];
    const uint4 h = pack8<T>(g);
    *u_at = h;
    *g_at = h;
  }
}

// dst[list[i]] = src[i] for i < min(cap, R): 16-bit rows copied, or fp32 rows rounded to T.
template <typename T, typename S>
__global__ void __launch_bounds__(kThreads)
    scatter_rows_kernel(const S* __restrict__ src, int64_t vectors_per_row, RowList l, T* dst) {
  chain_entry();
  const int64_t total = listed(l) * vectors_per_row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += stride) {
    const int64_t i = v / vectors_per_row, c = v % vectors_per_row;
    uint4 out;
    if constexpr (sizeof(S) == sizeof(float)) {
      const auto* f4 = reinterpret_cast<const float4*>(src + v * kVecElems);
      const float4 lo = f4[0], hi = f4[1];
      const float f[kVecElems] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      out = pack8<T>(f);
    } else {
      out = reinterpret_cast<const uint4*>(src)[v];
    }
    reinterpret_cast<uint4*>(dst)[int64_t(l.list[i]) * vectors_per_row + c] = out;
  }
}

unsigned grid_for(int64_t vectors, const DeviceInfo& dev) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((vectors + kThreads - 1) / kThreads,
                                                         int64_t(dev.sm_count) * ElementwiseConfig::kCtasPerSm)));
}

}  // namespace

int64_t routed_blas_rows(int64_t rows, size_t bytes_per_row, size_t budget) {
  const int64_t fit = int64_t(budget / bytes_per_row) / RoutedBlasConfig::kRowMultiple *
                      RoutedBlasConfig::kRowMultiple;
  return std::min(rows, fit);
}

void launch_gather_rows(const void* src, int64_t width, const RowList& l, void* dst, const DeviceInfo& dev,
                        cudaStream_t s, const char* op) {
  const int64_t per_row = width / kVecElems;
  if (l.cap == 0 || per_row == 0) return;
  launch(gather_rows_kernel, dim3(grid_for(l.cap * per_row, dev)), dim3(kThreads), 0, s,
         static_cast<const uint4*>(src), per_row, l, static_cast<uint4*>(dst));
  check_launch(op, "routed-row gather");
}

void launch_routed_product(DType dtype, void* hidden, int64_t n, const RowList& l, void* up, const DeviceInfo& dev,
                           cudaStream_t s, const char* op) {
  const int64_t per_row = n / kVecElems;
  if (l.cap == 0 || per_row == 0) return;
  with_element_type(dtype, op, [&](auto tag) {
    using T = decltype(tag);
    launch(routed_product_kernel<T>, dim3(grid_for(l.cap * per_row, dev)), dim3(kThreads), 0, s,
           static_cast<T*>(hidden), per_row, l, static_cast<T*>(up));
  });
  check_launch(op, "routed-row product");
}

void launch_scatter_rows(DType dtype, const void* src, bool src_f32, int64_t width, const RowList& l, void* dst,
                         const DeviceInfo& dev, cudaStream_t s, const char* op) {
  const int64_t per_row = width / kVecElems;
  if (l.cap == 0 || per_row == 0) return;
  const unsigned grid = grid_for(l.cap * per_row, dev);
  with_element_type(dtype, op, [&](auto tag) {
    using T = decltype(tag);
    if (src_f32)
      launch(scatter_rows_kernel<T, float>, dim3(grid), dim3(kThreads), 0, s, static_cast<const float*>(src),
             per_row, l, static_cast<T*>(dst));
    else
      launch(scatter_rows_kernel<T, T>, dim3(grid), dim3(kThreads), 0, s, static_cast<const T*>(src), per_row,
             l, static_cast<T*>(dst));
  });
  check_launch(op, "routed-row scatter");
}

void launch_routed_blas(LtGemm& lt, const RoutedArgs& a, int64_t cap, void* region, void* lt_workspace,
                        const DeviceInfo& dev, cudaStream_t s, const char* op) {
  if (cap == 0) return;
  const RowList l{a.routed_rows, a.num_routed, cap};
  const size_t es = dtype_size(a.dtype);
  char* rows_k = static_cast<char*>(region);          // [cap, K]: x rows, then y rows
  char* rows_n = rows_k + size_t(cap * a.k) * es;     // [cap, N]: u, then h (gated); h (plain)
  if (a.kind == FfnKind::gated) {
    launch_gather_rows(a.x, a.k, l, rows_k, dev, s, op);
    lt.run(linear_call(GemmId::up, cap, a.n, a.k, rows_k, a.up, rows_n), s, lt_workspace);
    launch_routed_product(a.dtype, a.hidden, a.n, l, rows_n, dev, s, op);
  } else {
    launch_gather_rows(a.hidden, a.n, l, rows_n, dev, s, op);
  }
  lt.run(matmul_call(GemmId::down, cap, a.k, a.n, rows_n, a.down, rows_k), s, lt_workspace);
  launch_scatter_rows(a.dtype, rows_k, false, a.k, l, a.y, dev, s, op);
}

}  // namespace twell::gpu
