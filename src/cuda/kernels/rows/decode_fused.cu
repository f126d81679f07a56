// Decoding in one kernel (M <= FusedDecodeConfig::kMaxRows tokens, N <= its kMaxIntermediate):
// the gate, the up dots and the down rows of the active neurons, spread over every SM, with one
// grid barrier between the last two. A cooperative launch of as many CTAs as fit on the device, so
// every CTA is resident and the barrier never waits on one that has not started.
//   gate:    the grid's warps take W1's rows round robin (row n: warp n mod warps). A lane holds 8
//            columns of the row per 16-byte load, kUnroll loads in flight, and reads the M tokens'
//            x through L1 (every warp of the SM reads the same x). pre[m] = <x[m], W1[n]>, fp32,
//            summed over the warp (butterfly). Token m lists n when pre is not <= 0: a NaN lists,
//            as it reaches y in the dense FFN; gated, -Inf lists too, with g = relu(-Inf) = 0, so
//            that 0 * <x, Wu[n]> gives the dense product's NaN where x's row holds an Inf.
//            The listing warp reads Wu[n] at once: h[m, n] = g * <x[m], Wu[n]> (gated) or g
//            (plain) into an fp32 [M, N] array, and lane m sets bit n of token m's bitmap (an
//            atomicOr: the set does not depend on the order). Lane 0 adds the warp's entries to
//            the run's active total (dispatch).
//   barrier: every CTA arrives at an integer counter (zeroed with the run's counters) and waits
//            until all have. The active total is then complete: CTA 0 writes the run's counters.
//   down:    work item (token m, slice of S columns of K); S is the host's slice_cols, the
//            narrowest multiple of 8 (a power of two) that leaves every CTA at most one item. The
//            CTA turns token m's bitmap into its ascending list of neurons in shared memory
//            (popcounts, a CTA scan). Thread (entry lane j of J, vector v of the slice) adds
//            h[m, n] * Wd[n, v's 8 columns] over the entries j, j + J, ... in order, kEntryUnroll
//            rows in flight, fp32; a column's J partial sums are added in entry-lane order and y
//            is rounded once.
// No float atomics and no order that depends on timing: reruns are bit-identical.
#include <string>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/scan.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/inference.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

using Cfg = FusedDecodeConfig;
constexpr int kWarps = Cfg::kThreads / kWarpSize;
constexpr int64_t kStepCols = int64_t(kWarpSize) * kVecElems;  // a warp's columns per 16-byte load
constexpr int kBitsPerWord = 32;
// The down slice's partial sums: J lanes x S columns = kThreads vectors of 8, whatever S is.
constexpr int kPartialFloats = Cfg::kThreads * kVecElems;
static_assert(Cfg::kMaxIntermediate <= 65536, "neuron indices fit the uint16 list");
static_assert(Cfg::kWordsPerThread * kBitsPerWord * Cfg::kThreads >= Cfg::kMaxIntermediate,
              "a token's bitmap fits the CTA's threads");
static_assert(Cfg::kMaxSliceCols / kVecElems <= Cfg::kThreads, "a slice's vectors fit the CTA");

// acc[m] = <x[m], w> over K (a multiple of 8): the lane's 8 columns per load, kUnroll loads of w
// in flight, x through L1; fp32, summed over the warp in every lane.
template <typename T, int kRows>
__device__ __forceinline__ void row_dots(const T* x, const T* w, int64_t k, int lane, float (&acc)[kRows]) {
#pragma unroll
  for (int m = 0; m < kRows; ++m) acc[m] = 0.0f;
  for (int64_t base = int64_t(lane) * kVecElems; base < k; base += Cfg::kUnroll * kStepCols) {
    uint4 wv[Cfg::kUnroll];
#pragma unroll
    for (int u = 0; u < Cfg::kUnroll; ++u) {
      const int64_t col = base + u * kStepCols;
      wv[u] = col < k ? load_readonly(w + col) : uint4{};
    }
#pragma unroll
    for (int u = 0; u < Cfg::kUnroll; ++u) {
      const int64_t col = base + u * kStepCols;
      if (col >= k) break;
      float wf[kVecElems];
      unpack8<T>(wv[u], wf);
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        float xf[kVecElems];
        unpack8<T>(load_readonly(x + m * k + col), xf);
#pragma unroll
        for (int i = 0; i < kVecElems; ++i) acc[m] = fmaf(xf[i], wf[i], acc[m]);
      }
    }
  }
  warp_sums(acc);
}

// gate: the warp's rows of W1, each listed row's h and bitmap bit written at once.
template <typename T, FfnKind kKind, int kRows>
__device__ __forceinline__ void gate_rows(const FusedDecodeArgs& a, int64_t words) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  const T* x = static_cast<const T*>(a.x);
  const T* w1 = static_cast<const T*>(a.first);
  const T* up = static_cast<const T*>(a.up);
  unsigned long long listed = 0;
  for (int64_t n = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize; n < a.n; n += warps) {
    float pre[kRows];
    row_dots<T, kRows>(x, w1 + n * a.k, a.k, lane, pre);
    bool active[kRows];
    bool any = false;
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const bool zero_times_u = kKind == FfnKind::gated && pre[m] == -INFINITY;
      active[m] = !(pre[m] <= 0.0f) || zero_times_u;
      if (zero_times_u) pre[m] = 0.0f;
      any = any || active[m];
    }
    if (!any) continue;  // the same in every lane
    float h[kRows];
    if constexpr (kKind == FfnKind::gated) {
      row_dots<T, kRows>(x, up + n * a.k, a.k, lane, h);
#pragma unroll
      for (int m = 0; m < kRows; ++m) h[m] *= pre[m];
    } else {
#pragma unroll
      for (int m = 0; m < kRows; ++m) h[m] = pre[m];
    }
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      if (lane == m && active[m]) {
        a.h[m * a.n + n] = h[m];
        atomicOr(a.bitmap + m * words + n / kBitsPerWord, 1u << (n % kBitsPerWord));
      }
      listed += active[m] ? 1 : 0;
    }
  }
  if (lane == 0 && listed != 0) atomicAdd(a.active, listed);
}

// Every CTA arrives, then waits for the rest; what any CTA wrote before is visible after (the
// down phase reads h and the bitmap from L2). The wait polls with relaxed loads, which leave L1
// alone (an acquiring load invalidates the SM's L1, where CTAs still in the gate keep x), and
// fences once.
__device__ __forceinline__ void grid_barrier(uint32_t* arrivals) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(arrivals, 1u);
    uint32_t seen = 0;
    for (;;) {
      asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrivals) : "memory");
      if (seen >= gridDim.x) break;
      __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

// down: token m's listed neurons, ascending, into list[0, total); returns total. Every thread.
__device__ __forceinline__ int64_t token_list(const FusedDecodeArgs& a, int64_t m, int64_t words, uint16_t* list,
                                              scan::ScanShared& sm) {
  const int64_t per = (words + Cfg::kThreads - 1) / Cfg::kThreads;  // <= kWordsPerThread
  const int64_t first = int64_t(threadIdx.x) * per;
  uint32_t mine[Cfg::kWordsPerThread];
  int64_t count = 0;
#pragma unroll
  for (int i = 0; i < Cfg::kWordsPerThread; ++i) {
    const int64_t w = first + i;
    mine[i] = i < per && w < words ? __ldcg(a.bitmap + m * words + w) : 0u;
    count += __popc(mine[i]);
  }
  int64_t total = 0;
  int64_t at = scan::exclusive_scan(count, sm, total);
#pragma unroll
  for (int i = 0; i < Cfg::kWordsPerThread; ++i)
    for (uint32_t b = mine[i]; b != 0; b &= b - 1)
      list[at++] = uint16_t((first + i) * kBitsPerWord + __ffs(int(b)) - 1);
  __syncthreads();
  return total;
}

// down: y[m, slice] from the list; `partials` holds J x S floats.
template <typename T>
__device__ __forceinline__ void down_slice(const FusedDecodeArgs& a, int64_t m, int64_t slice, int slice_cols,
                                           const uint16_t* list, int64_t total, float* partials) {
  const int vecs = slice_cols / kVecElems;
  const int lanes = Cfg::kThreads / vecs;
  const int v = threadIdx.x % vecs, j = threadIdx.x / vecs;
  const int64_t col = slice * slice_cols + int64_t(v) * kVecElems;
  const bool in_k = col < a.k;
  const T* down = static_cast<const T*>(a.down);
  const float* h = a.h + m * a.n;
  float acc[kVecElems] = {};
  for (int64_t e0 = j; e0 < total; e0 += int64_t(Cfg::kEntryUnroll) * lanes) {
    float hv[Cfg::kEntryUnroll];
    uint4 wv[Cfg::kEntryUnroll];
#pragma unroll
    for (int u = 0; u < Cfg::kEntryUnroll; ++u) {
      const int64_t e = e0 + int64_t(u) * lanes;
      const bool live = e < total;
      const int64_t n = live ? list[e] : 0;
      hv[u] = live ? __ldcg(h + n) : 0.0f;
      wv[u] = live && in_k ? load_readonly(down + n * a.k + col) : uint4{};
    }
#pragma unroll
    for (int u = 0; u < Cfg::kEntryUnroll; ++u) {
      if (e0 + int64_t(u) * lanes >= total) break;
      float wf[kVecElems];
      unpack8<T>(wv[u], wf);
#pragma unroll
      for (int i = 0; i < kVecElems; ++i) acc[i] = fmaf(hv[u], wf[i], acc[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kVecElems; ++i) partials[j * slice_cols + v * kVecElems + i] = acc[i];
  __syncthreads();
  const int64_t c = slice * slice_cols + threadIdx.x;
  if (threadIdx.x < slice_cols && c < a.k) {
    // Lanes past the entries hold zeros: the sum stops at the last lane that took one.
    const int used = total < lanes ? int(total) : lanes;
    float sum = 0.0f;
    for (int jj = 0; jj < used; ++jj) sum += partials[jj * slice_cols + threadIdx.x];
    static_cast<T*>(a.y)[m * a.k + c] = Elem<T>::from_float(sum);
  }
  __syncthreads();  // list and partials are rewritten by the CTA's next item
}

template <typename T, FfnKind kKind, int kRows>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinCtasPerSm) fused_decode_kernel(FusedDecodeArgs a,
                                                                                         int slice_cols) {
  extern __shared__ uint16_t list[];  // [N]: a token's listed neurons
  __shared__ float partials[kPartialFloats];
  __shared__ scan::ScanShared scan_shared;
  chain_entry();
  const int64_t words = (a.n + kBitsPerWord - 1) / kBitsPerWord;
  gate_rows<T, kKind, kRows>(a, words);
  grid_barrier(a.arrivals);
  if (a.counters != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    a.counters[0] = 0;  // the decode path routes no row
    a.counters[1] = int64_t(*static_cast<volatile unsigned long long*>(a.active));
  }
  const int64_t slices = (a.k + slice_cols - 1) / slice_cols;
  for (int64_t item = blockIdx.x; item < kRows * slices; item += gridDim.x) {
    const int64_t m = item / slices;
    const int64_t total = token_list(a, m, words, list, scan_shared);
    down_slice<T>(a, m, item % slices, slice_cols, list, total, partials);
  }
}

using Kernel = FusedDecodeKernel;

template <typename T, int kRows>
Kernel kernel_for(FfnKind kind) {
  return kind == FfnKind::gated ? fused_decode_kernel<T, FfnKind::gated, kRows>
                                : fused_decode_kernel<T, FfnKind::plain, kRows>;
}

Kernel fused_kernel(FfnKind kind, DType dtype, int64_t rows, const char* op) {
  static_assert(Cfg::kMaxRows == 4, "one instantiation per M");
  Kernel k = nullptr;
  with_element_type(dtype, op, [&](auto t) {
    using T = decltype(t);
    switch (rows) {
      case 1: k = kernel_for<T, 1>(kind); break;
      case 2: k = kernel_for<T, 2>(kind); break;
      case 3: k = kernel_for<T, 3>(kind); break;
      case 4: k = kernel_for<T, 4>(kind); break;
      default: throw Error(op, "x", "1 to 4 rows (fused decode kernel)", std::to_string(rows));
    }
  });
  return k;
}

}  // namespace

FusedDecodeLaunch fused_decode_setup(FfnKind kind, DType dtype, int64_t rows, int64_t k, int64_t n,
                                     const DeviceInfo& dev) {
  const char* op = "InferencePlan";
  FusedDecodeLaunch l;
  if (rows < 1 || rows > Cfg::kMaxRows || n > Cfg::kMaxIntermediate) return l;
  const Kernel kernel = fused_kernel(kind, dtype, rows, op);
  // The kernel's limit, not this plan's need: the attribute belongs to the kernel, which plans of
  // other N share.
  constexpr size_t kMostSmem = size_t(Cfg::kMaxIntermediate) * sizeof(uint16_t);
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMostSmem)), op,
             "fused decode kernel's shared memory");
  const size_t smem = (size_t(n) * sizeof(uint16_t) + 15) / 16 * 16;
  int per_sm = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cfg::kThreads, smem), op,
             "fused decode kernel's occupancy");
  if (per_sm < 1) return l;
  l.kernel = kernel;
  l.ctas = per_sm * dev.sm_count;
  l.smem = smem;
  int s = Cfg::kSliceCols;
  while (s < Cfg::kMaxSliceCols && rows * ((k + s - 1) / s) > l.ctas) s *= 2;
  l.slice_cols = s;
  return l;
}

bool launch_fused_decode(const FusedDecodeArgs& a, const FusedDecodeLaunch& l, cudaStream_t s) {
  const cudaError_t status =
      launch_cooperative(l.kernel, dim3(unsigned(l.ctas)), dim3(Cfg::kThreads), l.smem, s, a, l.slice_cols);
  if (status == cudaErrorCooperativeLaunchTooLarge) {
    (void)cudaGetLastError();  // a configuration error, not sticky: cleared, nothing was enqueued
    return false;
  }
  check_launch("InferencePlan::run", "fused decode kernel");
  return true;
}

}  // namespace twell::gpu
