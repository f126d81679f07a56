// Decoding in one kernel (M <= FusedDecodeConfig::kMaxRows tokens): the gate, the up dots and the
// down rows of the active neurons, one CTA per SM, with one grid barrier before the down rows. A
// cooperative launch, so every CTA is resident and the barrier never waits on one that has not
// started. Nothing is zeroed before the launch: every word the kernel reads, it wrote in this run.
//   gate:    CTA b owns W1's rows [b R, (b + 1) R), R = cta_rows, in groups of 16 rows (the mma's
//            m). x sits in shared memory (8, 16 or 32 token rows, zero past M and K). A chunk is one
//            group's 16 rows x kPartCols columns; warp w takes columns [64 w, 64 w + 64) of every
//            chunk, lane (g, q) = (lane / 4, lane % 4) loading 32 bytes of rows g and g + 8 straight
//            from global memory into registers, kDepth - 1 chunks ahead of the one in use. Four m16n8k16 mma per
//            8-token tile and chunk, A = those W1 rows, B = x: the lane's 16 columns are read whole
//            and dealt to the k16 steps four at a time (the same order for A and B, so the dot
//            product is unchanged). After a group's last chunk the 16 warps' fp32 partial tiles
//            (shared memory, two buffers) are added in warp order: pre[m, n].
//            Token m lists n when pre is not <= 0: a NaN lists, as it reaches y in the dense FFN;
//            gated, -Inf lists too, with g = relu(-Inf) = 0, so that 0 * <x, Wu[n]> gives the
//            dense product's NaN where x's row holds an Inf. g goes to an fp32 [M, N] array h, the
//            bit to the CTA's bitmap (token m, its rows), and the bitmap to global memory whole.
//            The Wu and Wd rows of each listed pair are asked into L2 as the gate finds them.
//   up:      gated: the CTA's listed (token m, row n) pairs dealt to warps by rank; h[m, n] =
//            g * <x[m], Wu[n]> (x from shared memory, lanes over K, kUnroll loads of Wu[n] in
//            flight, fp32, butterfly).
//   barrier: cooperative_groups' grid sync. The last CTA then adds up the bitmaps' popcounts: the
//            run's active total (dispatch) and counters.
//   down:    work item (token m, slice of S columns of K); S is the host's slice_cols, the
//            narrowest multiple of 8 (a power of two) that leaves every CTA at most one item, at
//            most kMaxSliceCols (where that leaves more items than CTAs, CTAs take several). The
//            CTA turns token m's bitmaps (CTA order, then bit order: ascending n) into its list of
//            neurons in shared memory (popcounts, a CTA scan). Thread (entry lane j of J, vector v
//            of the slice) adds h[m, n] * Wd[n, v's 8 columns] over the entries j, j + J, ... in
//            order, kEntryUnroll rows in flight, fp32; a column's J partial sums are added in
//            entry-lane order and y is rounded once.
// No float atomics and no order that depends on timing: reruns are bit-identical.
#include <cooperative_groups.h>

#include <algorithm>
#include <string>

#include "cuda/kernels/common/cp_async.cuh"
#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/mma.cuh"
#include "cuda/kernels/common/scan.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/inference.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

using Cfg = FusedDecodeConfig;
constexpr int kWarps = Cfg::kThreads / kWarpSize;
constexpr int kWarpCols = 64;  // a warp's columns of a chunk: 4 lanes x 16
constexpr int64_t kStepCols = int64_t(kWarpSize) * kVecElems;  // a warp's columns per 16-byte load
constexpr int kBitsPerWord = 32;
constexpr int kMaxWords = (Cfg::kMaxCtaRows + kBitsPerWord - 1) / kBitsPerWord;  // per CTA and token
constexpr int kPartialFloats = Cfg::kThreads * kVecElems;  // the down slice's J x S partial sums
static_assert(kWarps * kWarpCols == Cfg::kPartCols, "the warps split a chunk's columns");
static_assert(Cfg::kGroupRows == 16 && Cfg::kTileTokens == 8, "one m16n8k16 tile per group and 8 tokens");
static_assert(Cfg::kMaxRows <= 4 * Cfg::kTileTokens && Cfg::kMaxXParts % 4 == 0, "one, two or four token tiles");
static_assert(Cfg::kGroupRows * 4 * Cfg::kTileTokens <= Cfg::kThreads, "a thread per (row, token) of a group");
static_assert(Cfg::kMaxIntermediate <= 65536, "neuron indices fit the uint16 list");
static_assert(Cfg::kMaxSliceCols / kVecElems <= Cfg::kThreads, "a slice's vectors fit the CTA");

constexpr size_t kStaticSmemBytes = 1024;  // what the kernel declares statically (the scan's), rounded up

// Dynamic shared memory: x (row stride xs_ld), the warps' partial tiles (two buffers), the CTA's
// bitmaps. After the barrier x's bytes hold a token's list and the down slice's partial sums.
template <int kTiles>
struct Smem {
  static constexpr int kTokens = kTiles * Cfg::kTileTokens;
  static constexpr size_t red = 2 * size_t(kWarps) * kTiles * kWarpSize * 4 * sizeof(float);
  static constexpr size_t bits = size_t(Cfg::kMaxRows) * kMaxWords * sizeof(uint32_t);
  static constexpr size_t list = size_t(Cfg::kMaxIntermediate) * sizeof(uint16_t);  // the partials' offset
  static constexpr size_t down = list + kPartialFloats * sizeof(float);
  // x's row stride in elements for `parts` parts of K: one 16-byte vector of padding, so that the
  // rows g and g + 1 a quarter-warp reads fall on distinct banks.
  static __host__ __device__ int64_t xs_ld(int64_t parts) { return parts * Cfg::kPartCols + kVecElems; }
  static __host__ __device__ size_t front(int64_t parts) {  // x, then (after the barrier) the down state
    const size_t x = size_t(kTokens) * size_t(xs_ld(parts)) * 2;
    return ((x > down ? x : down) + 15) / 16 * 16;
  }
  static __host__ __device__ size_t bytes(int64_t parts) { return front(parts) + red + bits; }
};

// Asks for `bytes` (a multiple of 16) at p to be brought into L2, without waiting.
__device__ __forceinline__ void prefetch_l2(const void* p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(uint32_t(bytes)) : "memory");
#else
  for (int64_t at = 0; at < bytes; at += 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(p) + at) : "memory");
#endif
}

// <x, w> over K (a multiple of 8), x in shared memory: the lane's 8 columns per 16-byte load,
// kUnroll loads of w in flight; fp32, summed over the warp (the same in every lane).
template <typename T>
__device__ __forceinline__ float up_dot(const T* x, const T* w, int64_t k, int lane) {
  float acc = 0.0f;
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
      float wf[kVecElems], xf[kVecElems];
      unpack8<T>(wv[u], wf);
      unpack8<T>(*reinterpret_cast<const uint4*>(x + col), xf);
#pragma unroll
      for (int i = 0; i < kVecElems; ++i) acc = fmaf(xf[i], wf[i], acc);
    }
  }
  return warp_sum(acc);
}

// The lane's part of a chunk: rows g and g + 8 of the group, 16 columns each (two vectors).
struct Chunk {
  uint4 lo[2], hi[2];
};

// gate: the CTA's rows on the tensor cores; the listed (token, row) pairs' g into h and their bits
// into `bits` ([kMaxRows][kMaxWords], bit = row - r0).
template <typename T, FfnKind kKind, int kTiles>
__device__ __forceinline__ void gate(const FusedDecodeArgs& a, const FusedDecodeShape& sh, T* xs, float* red,
                                     uint32_t* bits) {
  constexpr int kTokens = kTiles * Cfg::kTileTokens;
  constexpr int kD = Cfg::kDepth;
  constexpr int kRed = kWarps * kTiles * kWarpSize * 4;  // floats per partial-tile buffer
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane / 4, q = lane % 4;
  const T* x = static_cast<const T*>(a.x);
  const T* w1 = static_cast<const T*>(a.first);
  const int64_t r0 = int64_t(blockIdx.x) * sh.cta_rows;
  const int64_t r1 = r0 + sh.cta_rows < a.n ? r0 + sh.cta_rows : a.n;
  const int64_t parts = (a.k + Cfg::kPartCols - 1) / Cfg::kPartCols;  // tiles x parts <= kMaxXParts
  const int64_t groups = r1 > r0 ? (r1 - r0 + Cfg::kGroupRows - 1) / Cfg::kGroupRows : 0;
  const int64_t chunks = groups * parts;
  const int64_t ld = Smem<kTiles>::xs_ld(parts);
  const int64_t row_vecs = parts * Cfg::kPartCols / kVecElems;
  // Chunk c: group c / parts, part c % parts; zeros past the CTA's rows and past K.
  const auto load = [&](int64_t c, Chunk& v) {
    if (c >= chunks) return;
    const int64_t lo = r0 + c / parts * Cfg::kGroupRows + g, hi = lo + 8;
    const int64_t col = c % parts * Cfg::kPartCols + warp * kWarpCols + q * 16;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool in_k = col + h * kVecElems < a.k;
      v.lo[h] = in_k && lo < r1 ? load_readonly(w1 + lo * a.k + col + h * kVecElems) : uint4{};
      v.hi[h] = in_k && hi < r1 ? load_readonly(w1 + hi * a.k + col + h * kVecElems) : uint4{};
    }
  };
  Chunk buf[kD];
#pragma unroll
  for (int d = 0; d < kD - 1; ++d) load(d, buf[d]);  // in flight while x is staged
  for (int64_t i = threadIdx.x; i < kTokens * row_vecs; i += Cfg::kThreads) {  // all of it in flight at once
    const int64_t m = i / row_vecs, col = i % row_vecs * kVecElems;
    const bool valid = m < a.rows && col < a.k;
    cp_async_16(xs + m * ld + col, valid ? x + m * a.k + col : x, valid);
  }
  cp_async_commit();
  for (int i = threadIdx.x; i < Cfg::kMaxRows * kMaxWords; i += Cfg::kThreads) bits[i] = 0;
  cp_async_wait<0>();
  __syncthreads();
  float acc[kTiles][4] = {};
  for (int64_t c0 = 0; c0 < chunks; c0 += kD) {
#pragma unroll
    for (int i = 0; i < kD; ++i) {
      const int64_t c = c0 + i;
      load(c + kD - 1, buf[(i + kD - 1) % kD]);
      if (c >= chunks) break;  // the same in every thread
      const Chunk& v = buf[i];
      const T* xrow = xs + g * ld + c % parts * Cfg::kPartCols + warp * kWarpCols + q * 16;
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4 b = *reinterpret_cast<const uint4*>(xrow + t * Cfg::kTileTokens * ld + h * kVecElems);
          const uint32_t first[4] = {v.lo[h].x, v.hi[h].x, v.lo[h].y, v.hi[h].y};
          const uint32_t second[4] = {v.lo[h].z, v.hi[h].z, v.lo[h].w, v.hi[h].w};
          mma_16816<T>(acc[t], first, b.x, b.y);
          mma_16816<T>(acc[t], second, b.z, b.w);
        }
      }
      if (c % parts != parts - 1) continue;
      // The group is done: its partial tiles, summed over the warps in warp order.
      const int64_t group = c / parts;
      float* part = red + group % 2 * kRed;  // the other buffer's readers finish before the next barrier
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        *reinterpret_cast<float4*>(part + ((warp * kTiles + t) * kWarpSize + lane) * 4) =
            make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
        acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
      }
      __syncthreads();
      if (threadIdx.x < Cfg::kGroupRows * kTokens) {
        const int row = threadIdx.x / kTokens, m = threadIdx.x % kTokens;
        const int t = m / Cfg::kTileTokens, col = m % Cfg::kTileTokens;
        // c[(row / 8) * 2 + col % 2] of lane (row % 8) * 4 + col / 2 (the mma's C fragment)
        const int at = t * kWarpSize * 4 + ((row % 8) * 4 + col / 2) * 4 + (row / 8) * 2 + col % 2;
        float pre = 0.0f;
        for (int w = 0; w < kWarps; ++w) pre += part[w * kTiles * kWarpSize * 4 + at];
        const int local = int(group) * Cfg::kGroupRows + row;
        const int64_t n = r0 + local;
        const bool zero_times_u = kKind == FfnKind::gated && pre == -INFINITY;
        if (m < a.rows && n < r1 && (!(pre <= 0.0f) || zero_times_u)) {
          a.h[m * a.n + n] = zero_times_u ? 0.0f : pre;
          atomicOr(bits + m * kMaxWords + local / kBitsPerWord, 1u << (local % kBitsPerWord));
          // The rows the up dot and the down rows will read, on their way to L2 while the gate goes on.
          const int64_t row_bytes = a.k * int64_t(sizeof(T));
          if constexpr (kKind == FfnKind::gated) prefetch_l2(static_cast<const T*>(a.up) + n * a.k, row_bytes);
          prefetch_l2(static_cast<const T*>(a.down) + n * a.k, row_bytes);
        }
      }
    }
  }
  __syncthreads();  // the bitmaps and g are complete; x's bytes are free
}

// up (gated): h[m, n] = g * <x[m], Wu[n]> for the CTA's listed pairs (token m, row n), dealt to
// warps by rank; x from shared memory (still staged; row stride ld).
template <typename T>
__device__ __forceinline__ void up_dots(const FusedDecodeArgs& a, const FusedDecodeShape& sh, const T* xs,
                                        int64_t ld, const uint32_t* bits) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const T* up = static_cast<const T*>(a.up);
  const int64_t r0 = int64_t(blockIdx.x) * sh.cta_rows;
  int rank = 0;
  for (int64_t m = 0; m < a.rows; ++m)
    for (int word = 0; word < sh.words; ++word)
      for (uint32_t left = bits[m * kMaxWords + word]; left != 0; left &= left - 1, ++rank) {
        if (rank % kWarps != warp) continue;
        const int64_t n = r0 + word * kBitsPerWord + __ffs(int(left)) - 1;
        const float dot = up_dot<T>(xs + m * ld, up + n * a.k, a.k, lane);
        if (lane == 0) a.h[m * a.n + n] *= dot;
      }
}

// After the barrier, in one CTA: the run's active total (every token's bitmaps) and counters.
__device__ __forceinline__ void write_counters(const FusedDecodeArgs& a, const FusedDecodeShape& sh,
                                               scan::ScanShared& sm) {
  const int64_t words = a.rows * int64_t(gridDim.x) * sh.words;
  int64_t mine = 0;
  for (int64_t w = threadIdx.x; w < words; w += Cfg::kThreads) mine += __popc(__ldcg(a.bitmap + w));
  int64_t total = 0;
  (void)scan::exclusive_scan(mine, sm, total);
  if (threadIdx.x == 0) {
    *a.active = static_cast<unsigned long long>(total);
    if (a.counters != nullptr) {
      a.counters[0] = 0;  // the decode path routes no row
      a.counters[1] = total;
    }
  }
  __syncthreads();  // sm is reused by the down items
}

// down: token m's listed neurons, ascending, into list[0, total); returns total. Every thread.
__device__ __forceinline__ int64_t token_list(const FusedDecodeArgs& a, const FusedDecodeShape& sh, int64_t m,
                                              uint16_t* list, scan::ScanShared& sm) {
  const int64_t words = int64_t(gridDim.x) * sh.words;              // <= kMaxTokenWords
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
  for (int i = 0; i < Cfg::kWordsPerThread; ++i) {
    const int64_t w = first + i;
    const int64_t base = w / sh.words * sh.cta_rows + w % sh.words * kBitsPerWord;  // CTA's row, word's bit 0
    for (uint32_t b = mine[i]; b != 0; b &= b - 1) list[at++] = uint16_t(base + __ffs(int(b)) - 1);
  }
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
    // Four chains (lanes j mod 4) in lane order, then added pairwise: a fixed order, a quarter of
    // the dependent adds.
    const int used = total < lanes ? int(total) : lanes;
    const float* p = partials + threadIdx.x;
    float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;
    int jj = 0;
    for (; jj + 4 <= used; jj += 4) {
      c0 += p[jj * slice_cols];
      c1 += p[(jj + 1) * slice_cols];
      c2 += p[(jj + 2) * slice_cols];
      c3 += p[(jj + 3) * slice_cols];
    }
    if (jj < used) c0 += p[jj * slice_cols];
    if (jj + 1 < used) c1 += p[(jj + 1) * slice_cols];
    if (jj + 2 < used) c2 += p[(jj + 2) * slice_cols];
    const float sum = (c0 + c1) + (c2 + c3);
    static_cast<T*>(a.y)[m * a.k + c] = Elem<T>::from_float(sum);
  }
  __syncthreads();  // list and partials are rewritten by the CTA's next item
}

template <typename T, FfnKind kKind, int kTiles>
__global__ void __launch_bounds__(Cfg::kThreads, 1) fused_decode_kernel(FusedDecodeArgs a, FusedDecodeShape sh) {
  using S = Smem<kTiles>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ scan::ScanShared scan_shared;
  const int64_t parts = (a.k + Cfg::kPartCols - 1) / Cfg::kPartCols;
  const size_t front = S::front(parts);
  auto* red = reinterpret_cast<float*>(smem + front);
  auto* bits = reinterpret_cast<uint32_t*>(smem + front + S::red);
  chain_entry();
  gate<T, kKind, kTiles>(a, sh, reinterpret_cast<T*>(smem), red, bits);
  for (int i = threadIdx.x; i < a.rows * sh.words; i += Cfg::kThreads) {
    const int m = i / sh.words, word = i % sh.words;
    a.bitmap[(int64_t(m) * gridDim.x + blockIdx.x) * sh.words + word] = bits[m * kMaxWords + word];
  }
  if constexpr (kKind == FfnKind::gated) up_dots<T>(a, sh, reinterpret_cast<const T*>(smem), S::xs_ld(parts), bits);
  cooperative_groups::this_grid().sync();

  const int64_t slices = (a.k + sh.slice_cols - 1) / sh.slice_cols;
  if (blockIdx.x == gridDim.x - 1) write_counters(a, sh, scan_shared);
  auto* list = reinterpret_cast<uint16_t*>(smem);
  auto* partials = reinterpret_cast<float*>(smem + S::list);
  for (int64_t item = blockIdx.x; item < a.rows * slices; item += gridDim.x) {
    const int64_t m = item / slices;
    const int64_t total = token_list(a, sh, m, list, scan_shared);
    down_slice<T>(a, m, item % slices, sh.slice_cols, list, total, partials);
  }
}

using Kernel = FusedDecodeKernel;

template <typename T, int kTiles>
Kernel kernel_for(FfnKind kind) {
  return kind == FfnKind::gated ? fused_decode_kernel<T, FfnKind::gated, kTiles>
                                : fused_decode_kernel<T, FfnKind::plain, kTiles>;
}

// One token-tile count's kernel for the plan's shape: kernel = nullptr where it does not fit.
struct TileSetup {
  Kernel kernel = nullptr;
  size_t smem = 0;
};

// optin: the device's shared memory a CTA may opt in to.
template <int kTiles>
TileSetup tile_setup(FfnKind kind, DType dtype, int64_t parts, int optin) {
  const char* op = "InferencePlan";
  TileSetup none;
  if (parts * kTiles > Cfg::kMaxXParts) return none;
  Kernel kernel = nullptr;
  with_element_type(dtype, op, [&](auto t) { kernel = kernel_for<decltype(t), kTiles>(kind); });
  // The attribute belongs to the kernel, which plans of other K share: its largest need, or what
  // the device allows a CTA where that is less.
  const size_t allowed = size_t(optin) > kStaticSmemBytes ? size_t(optin) - kStaticSmemBytes : 0;
  const size_t most = std::min(Smem<kTiles>::bytes(Cfg::kMaxXParts / kTiles), allowed);
  const size_t smem = Smem<kTiles>::bytes(parts);
  if (smem > most ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most)) != cudaSuccess) {
    (void)cudaGetLastError();  // more shared memory than the device gives a CTA: the two-kernel path
    return none;
  }
  int per_sm = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cfg::kThreads, smem), op,
             "fused decode kernel's occupancy");
  return per_sm < 1 ? none : TileSetup{kernel, smem};
}

}  // namespace

FusedDecodeLaunches fused_decode_setup(FfnKind kind, DType dtype, int64_t k, int64_t n, const DeviceInfo& dev) {
  FusedDecodeLaunches out{};
  if (n > Cfg::kMaxIntermediate || dev.sm_count < 1) return out;
  const int64_t parts = (k + Cfg::kPartCols - 1) / Cfg::kPartCols;
  const int64_t cta_rows = (n + dev.sm_count - 1) / dev.sm_count;
  const int64_t words = (cta_rows + kBitsPerWord - 1) / kBitsPerWord;
  if (cta_rows > Cfg::kMaxCtaRows || dev.sm_count * words > Cfg::kMaxTokenWords) return out;
  int optin = 0;
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev.index), "InferencePlan",
             "cudaDevAttrMaxSharedMemoryPerBlockOptin");
  const TileSetup by_tiles[3] = {tile_setup<1>(kind, dtype, parts, optin), tile_setup<2>(kind, dtype, parts, optin),
                                 tile_setup<4>(kind, dtype, parts, optin)};
  for (int64_t rows = 1; rows <= Cfg::kMaxRows; ++rows) {
    const TileSetup& t = by_tiles[rows <= Cfg::kTileTokens ? 0 : rows <= 2 * Cfg::kTileTokens ? 1 : 2];
    if (t.kernel == nullptr) continue;
    FusedDecodeLaunch& l = out[size_t(rows)];
    l.kernel = t.kernel;
    l.ctas = dev.sm_count;
    l.shape.cta_rows = int(cta_rows);
    l.shape.words = int(words);
    int s = Cfg::kSliceCols;
    while (s < Cfg::kMaxSliceCols && rows * ((k + s - 1) / s) > l.ctas) s *= 2;
    l.shape.slice_cols = s;
    l.smem = t.smem;
  }
  return out;
}

bool launch_fused_decode(const FusedDecodeArgs& a, const FusedDecodeLaunch& l, cudaStream_t s) {
  const cudaError_t status =
      launch_cooperative(l.kernel, dim3(unsigned(l.ctas)), dim3(Cfg::kThreads), l.smem, s, a, l.shape);
  if (status == cudaErrorCooperativeLaunchTooLarge) {
    (void)cudaGetLastError();  // a configuration error, not sticky: cleared, nothing was enqueued
    return false;
  }
  check_launch("InferencePlan::run", "fused decode kernel");
  return true;
}

}  // namespace twell::gpu
