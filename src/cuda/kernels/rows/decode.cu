// Decoding (M <= DecodeConfig::kMaxRows): after the gate GEMM (G = x W1^T, cuBLASLt), two
// kernels that touch only the active neurons, spread over the whole GPU however few tokens run. A
// chunk is kChunk consecutive neurons; every (token, chunk) keeps its list of active entries
// {neuron, h} in ascending order and its count.
//   dots:  CTA = (chunk, token m). Warp 0 reads G[m, chunk] (the gate GEMM's pre-activations; lane
//          = neuron) and ballots the active ones: "not <= 0", so a NaN pre-activation is active
//          and NaN reaches y as in the dense FFN (gated: -Inf too, with g = relu(-Inf) = 0). The entries are dealt to warps two at a time: h = g * <x[m], Wu[n]> (gated; lanes
//          over K in 16-byte vectors, kUnroll loads of each row in flight, fp32, warp butterfly)
//          or h = g (plain). The count also goes into the run's active total (an integer atomic,
//          for dispatch).
//   axpys: CTA (slice of kSliceCols columns of K, token m, split s of S): the token's chunk counts
//          loaded at once and scanned by the CTA. S is the launched splits cut to what the token's
//          count needs (kWarps x kUnroll entries a split, one round of loads); the CTAs past it
//          leave. The token's entries in order (chunk by chunk),
//          every S-th group of kWarps from group s, dealt to warps round robin, kUnroll in flight;
//          lane owns 8 columns: acc += h * Wd[n, cols] (fp32). The warps' sums are added in warp
//          order in shared memory; S = 1 writes y[m, slice] (rounded once), S > 1 writes an fp32
//          partial, and the CTA that arrives last at (m, slice) (an integer counter, zeroed with
//          the run's counters) adds the S partials in split order and writes y.
// No float atomics and no order that depends on timing: reruns are bit-identical.
#include <algorithm>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/scan.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/inference.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

using Cfg = DecodeConfig;
constexpr int kWarps = Cfg::kThreads / kWarpSize;
constexpr int64_t kStepCols = int64_t(kWarpSize) * kVecElems;  // a warp's columns per 16-byte load
constexpr int kUnroll = Cfg::kUnroll;
constexpr int kScanLoads = 4;  // chunk counts a thread loads at once
constexpr int32_t kSplitEntries = kWarps * kUnroll;  // a split's entries: one round of loads
static_assert(Cfg::kThreads % kWarpSize == 0 && Cfg::kThreads <= 1024, "whole warps within the CTA limit");
static_assert(Cfg::kChunk == kWarpSize, "the lists ballot one neuron per lane");
static_assert(Cfg::kSliceCols == kStepCols, "an axpys slice is one 16-byte vector per lane");

// Where token m's chunk c keeps its entries.
__device__ __forceinline__ int64_t list_base(int64_t m, int64_t c, int64_t chunks) {
  return (m * chunks + c) * Cfg::kChunk;
}

// <x0, w0> and <x1, w1> over K (a multiple of 8): lanes over K, kUnroll loads of each in flight,
// fp32, summed over the warp.
template <typename T>
__device__ __forceinline__ void dot2(const T* x0, const T* w0, const T* x1, const T* w1, int64_t k, int lane,
                                     float& d0, float& d1) {
  d0 = d1 = 0.0f;
  for (int64_t base = int64_t(lane) * kVecElems; base < k; base += kUnroll * kStepCols) {
    uint4 p[kUnroll], a[kUnroll], q[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t col = base + u * kStepCols;
      const bool in = col < k;
      p[u] = in ? load_readonly(x0 + col) : uint4{};
      a[u] = in ? load_readonly(w0 + col) : uint4{};
      q[u] = in ? load_readonly(x1 + col) : uint4{};
      b[u] = in ? load_readonly(w1 + col) : uint4{};
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float pf[kVecElems], af[kVecElems], qf[kVecElems], bf[kVecElems];
      unpack8<T>(p[u], pf);
      unpack8<T>(a[u], af);
      unpack8<T>(q[u], qf);
      unpack8<T>(b[u], bf);
#pragma unroll
      for (int i = 0; i < kVecElems; ++i) {
        d0 = fmaf(pf[i], af[i], d0);
        d1 = fmaf(qf[i], bf[i], d1);
      }
    }
  }
  d0 = warp_sum(d0);
  d1 = warp_sum(d1);
}

// The list of chunk blockIdx.x for token blockIdx.y, from the gate GEMM's G.
template <typename T, FfnKind kKind>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kDotsCtasPerSm) dots_kernel(DecodeArgs a) {
  __shared__ int32_t neurons[Cfg::kChunk];
  __shared__ float gates[Cfg::kChunk];
  __shared__ int32_t count;
  chain_entry();
  const int64_t c = blockIdx.x, m = blockIdx.y, chunks = gridDim.x;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (warp == 0) {
    const int64_t n = c * Cfg::kChunk + lane;
    const float pre = n < a.n ? Elem<T>::to_float(static_cast<const T*>(a.hidden)[m * a.n + n]) : 0.0f;
    // relu(-Inf) = 0, but 0 * u is NaN in the dense product where u is not finite (x's row holds an
    // Inf): a gated layer lists -Inf with g = 0, so h = 0 * <x, Wu[n]> comes out as the dense one.
    const bool zero_times_u = kKind == FfnKind::gated && pre == -INFINITY;
    const bool active = n < a.n && (!(pre <= 0.0f) || zero_times_u);
    const float g = zero_times_u ? 0.0f : pre;
    const unsigned mask = __ballot_sync(kFullMask, active);
    if (active) {
      const int e = __popc(mask & ((1u << lane) - 1u));
      neurons[e] = int32_t(n);
      gates[e] = g;
    }
    if (lane == 0) {
      count = __popc(mask);
      a.counts[m * chunks + c] = count;
      if (count > 0) atomicAdd(a.active, static_cast<unsigned long long>(count));
    }
  }
  __syncthreads();
  const int32_t total = count;
  const int64_t base = list_base(m, c, chunks);
  if constexpr (kKind == FfnKind::plain) {
    for (int32_t e = threadIdx.x; e < total; e += Cfg::kThreads) {
      a.neurons[base + e] = neurons[e];
      a.h[base + e] = gates[e];
    }
  } else {
    const T* up = static_cast<const T*>(a.up);
    const T* x = static_cast<const T*>(a.x) + m * a.k;
    for (int32_t e0 = warp; e0 < total; e0 += 2 * kWarps) {
      const int32_t e1 = e0 + kWarps;
      const bool two = e1 < total;
      float d0, d1;
      dot2<T>(x, up + int64_t(neurons[e0]) * a.k, x, up + int64_t(neurons[two ? e1 : e0]) * a.k, a.k, lane, d0,
              d1);
      if (lane == 0) {
        a.neurons[base + e0] = neurons[e0];
        a.h[base + e0] = gates[e0] * d0;
        if (two) {
          a.neurons[base + e1] = neurons[e1];
          a.h[base + e1] = gates[e1] * d1;
        }
      }
    }
  }
}

// axpys: prefix[c] = token m's entries before chunk c (c <= chunks): an exclusive scan of the
// chunk counts, a contiguous run of them per thread, all loaded at once. Every thread of the CTA;
// the caller synchronises before reading prefix.
__device__ __forceinline__ void scan_chunk_counts(const DecodeArgs& a, int64_t m, int32_t* prefix,
                                                  scan::ScanShared& sm) {
  const int64_t chunks = a.chunks;
  const int64_t per = (chunks + Cfg::kThreads - 1) / Cfg::kThreads;
  const int64_t first = threadIdx.x * per, last = min(first + per, chunks);
  int32_t mine = 0;
  for (int64_t c0 = first; c0 < last; c0 += kScanLoads) {  // kScanLoads loads in flight
    int32_t v[kScanLoads];
#pragma unroll
    for (int u = 0; u < kScanLoads; ++u) v[u] = c0 + u < last ? a.counts[m * chunks + c0 + u] : 0;
#pragma unroll
    for (int u = 0; u < kScanLoads; ++u) {
      if (c0 + u < last) prefix[c0 + u] = v[u];
      mine += v[u];
    }
  }
  int64_t total = 0;
  int32_t before = int32_t(scan::exclusive_scan(mine, sm, total));
  for (int64_t c = first; c < last; ++c) {
    const int32_t v = prefix[c];
    prefix[c] = before;
    before += v;
  }
  if (threadIdx.x == 0) prefix[chunks] = int32_t(total);
}

// Where token m keeps its entry f: its chunk by binary search over the prefix, then its list
// position.
__device__ __forceinline__ int64_t entry_at(const int32_t* prefix, int64_t chunks, int64_t m, int32_t f) {
  int64_t lo = 0, hi = chunks;  // prefix[lo] <= f < prefix[hi]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (prefix[mid] <= f) lo = mid; else hi = mid;
  }
  return list_base(m, lo, chunks) + (f - prefix[lo]);
}

// axpys: the warp's share of token m's entries (every S-th group of kWarps from group `split`,
// kUnroll in flight) for its lane's 8 columns of the slice: acc += h * Wd[n, cols], in entry order.
template <typename T>
__device__ __forceinline__ void accumulate_entries(const DecodeArgs& a, const int32_t* prefix, int64_t m,
                                                   int64_t slice, int64_t split, int64_t splits, int lane,
                                                   int warp, float (&acc)[kVecElems]) {
  const int64_t chunks = a.chunks, k = a.k;
  const int32_t total = prefix[chunks];
  const int64_t col = slice * Cfg::kSliceCols + int64_t(lane) * kVecElems;
  const bool in_k = col < k;
  const T* down = static_cast<const T*>(a.down);
  const int32_t stride = int32_t(splits) * kWarps;
  for (int32_t f0 = int32_t(split) * kWarps + warp; f0 < total; f0 += kUnroll * stride) {
    float h[kUnroll];
    uint4 w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t f = f0 + u * stride;
      const bool live = f < total;
      const int64_t at = entry_at(prefix, chunks, m, live ? f : f0);
      h[u] = live ? a.h[at] : 0.0f;
      w[u] = in_k ? load_readonly(down + int64_t(a.neurons[at]) * k + col) : uint4{};
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (f0 + u * stride >= total) break;
      float wf[kVecElems];
      unpack8<T>(w[u], wf);
#pragma unroll
      for (int i = 0; i < kVecElems; ++i) acc[i] = fmaf(h[u], wf[i], acc[i]);
    }
  }
}

// axpys: the slice's column sums over the warps (warp order) into y (S = 1), or into split s's
// fp32 partial, the last CTA to arrive at (m, slice) adding the S partials in split order into y.
template <typename T>
__device__ __forceinline__ void write_slice(const DecodeArgs& a, const float (&sums)[kWarps][Cfg::kSliceCols],
                                            bool& last_arrival, int64_t m, int64_t slice, int64_t split,
                                            int64_t splits) {
  const int64_t k = a.k;
  const int64_t j = slice * Cfg::kSliceCols + threadIdx.x;  // this thread's column of the slice
  const bool mine = threadIdx.x < Cfg::kSliceCols && j < k;
  float v = 0.0f;
  if (threadIdx.x < Cfg::kSliceCols)
    for (int w = 0; w < kWarps; ++w) v += sums[w][threadIdx.x];
  T* y = static_cast<T*>(a.y) + m * k;
  if (splits == 1) {
    if (mine) y[j] = Elem<T>::from_float(v);
    return;
  }
  if (mine) a.partials[(split * a.rows + m) * k + j] = v;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t arrived = atomicAdd(&a.arrivals[m * gridDim.x + slice], 1);
    last_arrival = arrived == splits - 1;
  }
  __syncthreads();
  if (!last_arrival || !mine) return;
  __threadfence();
  float sum = 0.0f;
#pragma unroll 8
  for (int64_t s = 0; s < splits; ++s) sum += a.partials[(s * a.rows + m) * k + j];
  y[j] = Elem<T>::from_float(sum);
}

template <typename T>
__global__ void __launch_bounds__(Cfg::kThreads) axpys_kernel(DecodeArgs a) {
  extern __shared__ int32_t prefix[];  // [chunks + 1]: the token's entries before each chunk
  __shared__ float sums[kWarps][Cfg::kSliceCols];
  __shared__ bool last_arrival;
  __shared__ scan::ScanShared scan_shared;
  chain_entry();
  const int64_t slice = blockIdx.x, m = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  scan_chunk_counts(a, m, prefix, scan_shared);
  __syncthreads();
  // The splits this token's entries need, from its count (the same in every CTA of the token):
  // the others leave.
  const int64_t needed = (int64_t(prefix[a.chunks]) + kSplitEntries - 1) / kSplitEntries;
  const int64_t splits = needed < 1 ? 1 : needed < gridDim.z ? needed : int64_t(gridDim.z);
  if (split >= splits) return;
  float acc[kVecElems] = {};
  accumulate_entries<T>(a, prefix, m, slice, split, splits, lane, warp, acc);
#pragma unroll
  for (int i = 0; i < kVecElems; ++i) sums[warp][lane * kVecElems + i] = acc[i];
  __syncthreads();
  write_slice<T>(a, sums, last_arrival, m, slice, split, splits);
}

}  // namespace

DecodeGrid decode_grid(int64_t rows, int64_t k, const DeviceInfo& dev) {
  DecodeGrid g;
  g.slices = Cfg::slices(k);
  const int64_t ctas = std::max<int64_t>(g.slices * rows, 1);
  const int64_t wanted = (int64_t(dev.sm_count) * Cfg::kAxpyCtasPerSm + ctas - 1) / ctas;
  const int64_t most =
      std::min<int64_t>(Cfg::kMaxSplits, std::max<int64_t>(1, Cfg::kMaxSplitRows / std::max<int64_t>(rows, 1)));
  g.splits = std::clamp<int64_t>(wanted, 1, most);
  return g;
}

void launch_decode(const DecodeArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const char* op = "InferencePlan::run";
  const DecodeGrid g = decode_grid(a.rows, a.k, dev);
  with_element_type(a.dtype, op, [&](auto t) {
    using T = decltype(t);
    launch(a.kind == FfnKind::gated ? dots_kernel<T, FfnKind::gated> : dots_kernel<T, FfnKind::plain>,
           dim3(unsigned(a.chunks), unsigned(a.rows)), dim3(Cfg::kThreads), 0, s, a);
    check_launch(op, "decode dots kernel");
    launch(axpys_kernel<T>, dim3(unsigned(g.slices), unsigned(a.rows), unsigned(g.splits)), dim3(Cfg::kThreads),
           size_t(a.chunks + 1) * sizeof(int32_t), s, a);
    check_launch(op, "decode axpys kernel");
  });
}

}  // namespace twell::gpu
