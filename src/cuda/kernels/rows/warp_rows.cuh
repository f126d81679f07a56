// Device code shared by the warp-per-row kernels (inference row_ffn.cu, training
// forward_rows.cu and backward_rows.cu): one warp owns one K-wide row, K a multiple of
// 256 (RowConfig::kChunk) up to RowConfig::kMaxHidden; lane l holds columns [c * 256 + 8 l,
// c * 256 + 8 l + 8) of every chunk c, one 16-byte vector each. A compact row's TwELL entries are
// decoded 32 at a time, one per lane, in TwELL order (tiles ascending, columns ascending).
#pragma once
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/policy/config.hpp"
#include "twell/format.hpp"

namespace twell::gpu::warp_rows {

constexpr int kMaxChunks = int(RowConfig::kMaxHidden / RowConfig::kChunk);
static_assert(RowConfig::kChunk == kWarpSize * kVecElems, "a chunk is one 16-byte vector per lane");

// What a warp-per-row pass computes per entry: everything (fused), or one half, as two kernels:
// the dots (x . Wu[n] forward, dy . Wd[n] backward), stored per entry, then the axpys that read
// them back (Wd forward, W1 and Wu backward). Each kernel then streams fewer weight rows, which
// fit in L2 where all of them together do not (Wu and Wd of a 2048 x 5632 layer are 46 MB, more
// than an H100's or H200's L2); the results are bit-identical to the fused pass.
enum class Phase : uint8_t { fused, dots, axpys };

// Whether the warp-per-row kernels take rows of this K.
inline bool supports(int64_t k) { return k % RowConfig::kChunk == 0 && k <= RowConfig::kMaxHidden; }

// Host: calls launch(std::integral_constant<int, K / 256>) for a supported K.
template <int kChunks = 1, typename Launch>
void with_chunks(int chunks, Launch&& launch) {
  if constexpr (kChunks < kMaxChunks) {
    if (chunks > kChunks) return with_chunks<kChunks + 1>(chunks, launch);
  }
  launch(std::integral_constant<int, kChunks>{});
}

// The lane's column offset inside a chunk.
__device__ __forceinline__ int64_t lane_col(int lane) { return int64_t(lane) * kVecElems; }

template <typename T, int kChunks>
__device__ __forceinline__ void load_row(const T* row, int lane, uint4 (&out)[kChunks]) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) out[c] = load_readonly(row + c * RowConfig::kChunk + lane_col(lane));
}

template <int kChunks>
__device__ __forceinline__ void zero(float (&acc)[kChunks][kVecElems]) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) acc[c][e] = 0.0f;
}

template <typename T, int kChunks>
__device__ __forceinline__ void store_row(T* row, int lane, const float (&acc)[kChunks][kVecElems]) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
    *reinterpret_cast<uint4*>(row + c * RowConfig::kChunk + lane_col(lane)) = pack8<T>(acc[c]);
}

// The full dots <r, w0> and <r, w1> (every lane ends with both): both rows' loads issued first.
template <typename T, int kChunks>
__device__ __forceinline__ void dot2(const uint4 (&r)[kChunks], const T* w0, const T* w1, int lane,
                                     float& d0, float& d1) {
  d0 = 0.0f;
  d1 = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    float rv[kVecElems], a[kVecElems], b[kVecElems];
    unpack8<T>(r[c], rv);
    unpack8<T>(load_readonly(w0 + c * RowConfig::kChunk + lane_col(lane)), a);
    unpack8<T>(load_readonly(w1 + c * RowConfig::kChunk + lane_col(lane)), b);
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) {
      d0 = fmaf(rv[e], a[e], d0);
      d1 = fmaf(rv[e], b[e], d1);
    }
  }
  float d[2] = {d0, d1};
  warp_sums(d);
  d0 = d[0];
  d1 = d[1];
}

// acc += c0 * w0 + c1 * w1 (in that order per element).
template <typename T, int kChunks>
__device__ __forceinline__ void axpy2(float (&acc)[kChunks][kVecElems], float c0, const T* w0, float c1,
                                      const T* w1, int lane) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    float a[kVecElems], b[kVecElems];
    unpack8<T>(load_readonly(w0 + c * RowConfig::kChunk + lane_col(lane)), a);
    unpack8<T>(load_readonly(w1 + c * RowConfig::kChunk + lane_col(lane)), b);
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) acc[c][e] = fmaf(c1, b[e], fmaf(c0, a[e], acc[c][e]));
  }
}

// Writes the lane's accumulators into a K-wide shared row of partial sums.
template <int kChunks>
__device__ __forceinline__ void spill(float* partial, int lane, const float (&acc)[kChunks][kVecElems]) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) partial[c * RowConfig::kChunk + lane_col(lane) + e] = acc[c][e];
}

// Every thread of the CTA: out[col] = sum over w of partial[w][col], in warp order, rounded once.
template <typename T, int kWarps, int kCols>
__device__ __forceinline__ void sum_partials(const float (&partial)[kWarps][kCols], T* out) {
  for (int col = threadIdx.x; col < kCols; col += blockDim.x) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][col];
    out[col] = Elem<T>::from_float(sum);
  }
}

// A CTA's warps meet on one row: warp `warp` spills acc into partial[warp], and after the barrier
// out = sum_partials(partial). Every thread of the CTA; the caller synchronises before partial is
// rewritten.
template <typename T, int kWarps, int kChunks>
__device__ __forceinline__ void sum_warps(float (&partial)[kWarps][kChunks * RowConfig::kChunk], int warp,
                                          int lane, const float (&acc)[kChunks][kVecElems], T* out) {
  spill(partial[warp], lane, acc);
  __syncthreads();
  sum_partials<T, kWarps, kChunks * RowConfig::kChunk>(partial, out);
}

// Entries of a compact row (sum of its tile counts), identical in every lane.
__device__ __forceinline__ int row_entries(const TwellView& tw, int64_t row, int lane) {
  const int num_tiles = int((tw.shape.cols + tw.shape.tile - 1) / tw.shape.tile);
  int total = 0;
  for (int t = lane; t < num_tiles; t += kWarpSize) total += tw.counts[row * num_tiles + t];
  return warp_sum(total);
}

// Calls f(neuron, slot, count) once per group of up to 32 entries of compact row `row`, in TwELL
// order: lane j holds entry j of the group (its neuron and its slot in the value planes); lanes
// j >= count hold neuron 0 and slot -1. Tiles are taken 32 at a time: lane t holds tile t's count,
// a warp scan gives each entry its tile.
template <typename F>
__device__ __forceinline__ void for_each_entry_group(const TwellView& tw, int64_t row, int lane, F&& f) {
  const int num_tiles = int((tw.shape.cols + tw.shape.tile - 1) / tw.shape.tile);
  for (int t0 = 0; t0 < num_tiles; t0 += kWarpSize) {
    const int t = t0 + lane;
    const int count = t < num_tiles ? tw.counts[row * num_tiles + t] : 0;
    int incl = count;  // inclusive prefix sum of the counts over the lanes
#pragma unroll
    for (int s = 1; s < kWarpSize; s <<= 1) {
      const int v = __shfl_up_sync(kFullMask, incl, s);
      if (lane >= s) incl += v;
    }
    const int total = __shfl_sync(kFullMask, incl, kWarpSize - 1);
    for (int e0 = 0; e0 < total; e0 += kWarpSize) {
      const int e = e0 + lane;
      // The tile of entry e: the number of lanes whose inclusive sum is <= e.
      int tile = 0, before = 0;
      for (int j = 0; j < kWarpSize; ++j) {
        const int inc_j = __shfl_sync(kFullMask, incl, j);
        if (inc_j <= e) {
          tile = j + 1;
          before = inc_j;
        }
      }
      int neuron = 0;
      int64_t slot = -1;
      if (e < total) {
        slot = (row * num_tiles + t0 + tile) * tw.shape.capacity + (e - before);
        neuron = (t0 + tile) * tw.shape.tile + tw.cols[slot];
      }
      f(neuron, slot, min(kWarpSize, total - e0));
    }
  }
}

// Entries i and j() = i + 1 of a group of `count` held one per lane (lane e: entry e); when one is
// left (two() false), j() = i. two() and j() are computed where a caller uses them.
struct LanePair {
  int i, count;
  __device__ __forceinline__ bool two() const { return i + 1 < count; }
  __device__ __forceinline__ int j() const { return two() ? i + 1 : i; }
  template <typename V>
  __device__ __forceinline__ V first(V lane_value) const { return __shfl_sync(kFullMask, lane_value, i); }
  template <typename V>
  __device__ __forceinline__ V second(V lane_value) const { return __shfl_sync(kFullMask, lane_value, j()); }
};

// Calls f(pair) for a group of `count` (<= 32) entries held one per lane, two at a time, in order.
// Every lane.
template <typename F>
__device__ __forceinline__ void for_each_lane_pair(int count, F&& f) {
  for (int i = 0; i < count; i += 2) f(LanePair{i, count});
}

// A LanePair of for_each_entry_group's entries with its fields evaluated: lanes i and j (`two`
// false: j = i), the entries' neurons and slots.
struct EntryPair {
  bool two;
  int i, j;
  int n0, n1;      // their neurons
  int64_t s0, s1;  // their slots
  template <typename V>
  __device__ __forceinline__ V first(V lane_value) const { return __shfl_sync(kFullMask, lane_value, i); }
  template <typename V>
  __device__ __forceinline__ V second(V lane_value) const { return __shfl_sync(kFullMask, lane_value, j); }
};

// Calls f(pair) for a group's entries (for_each_entry_group's neuron, slot, count) two at a time,
// in order (for_each_lane_pair). Every lane.
template <typename F>
__device__ __forceinline__ void for_each_pair(int neuron, int64_t slot, int count, F&& f) {
  for_each_lane_pair(count, [&](const LanePair& p) {
    EntryPair e;
    e.two = p.two();
    e.i = p.i;
    e.j = p.j();
    e.n0 = e.first(neuron);
    e.n1 = e.second(neuron);
    e.s0 = e.first(slot);
    e.s1 = e.second(slot);
    f(e);
  });
}

// A row kernel overlapped with the fused gate (GatePackArgs::ready): returns once the gate has
// packed the row's block of GatePackConfig::kBlockM rows (ready[block] == target). Lane 0
// acquires the counter; the warp barrier orders the other lanes' reads after it. `known`: the
// last block seen complete (a warp's rows come from its queue in increasing order).
__device__ __forceinline__ void wait_for_block(const int32_t* ready, int32_t target, int64_t row,
                                               int64_t& known, int lane) {
  const int64_t block = row / GatePackConfig::kBlockM;
  if (block <= known) return;
  if (lane == 0) {
    for (;;) {
      int32_t v;
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(ready + block) : "memory");
      if (v >= target) break;
      __nanosleep(128);
    }
  }
  __syncwarp();
  known = block;
}

// The next row of a queue shared by every warp of the grid (identical in every lane).
__device__ __forceinline__ int64_t next_row(int32_t* head, int lane) {
  int64_t row = 0;
  if (lane == 0) row = atomicAdd(head, 1);
  return __shfl_sync(kFullMask, row, 0);
}

// A warp-per-row kernel's queue (warp_row_kernel.cuh): its head, and where the rows too long for a
// warp are listed (long_rows[(*num_long)++]; long_rows nullptr: this kernel lists none).
struct RowQueue {
  int32_t* head;
  int32_t* long_rows;
  int32_t* num_long;
};

// The queue protocol of the warp-per-row kernels, for a row a warp has taken from its queue: its
// entries where the row is the warp's, a compact row (row_slot -1: not routed, nor marked for
// routing; the dense backup computes those) of at most long_row entries, else -1. A longer one is
// listed (RowQueue). Identical in every lane.
__device__ __forceinline__ int short_row_entries(const TwellView& tw, int64_t row, int long_row, int lane,
                                                 const RowQueue& q) {
  if (tw.row_slot[row] != -1) return -1;
  const int entries = row_entries(tw, row, lane);
  if (entries > long_row) {
    if (q.long_rows != nullptr && lane == 0) q.long_rows[atomicAdd(q.num_long, 1)] = int32_t(row);
    return -1;
  }
  return entries;
}

// The long-row kernel's side of that protocol: row_fn(row) for each row listed at
// long_rows[0, control[1]), a CTA each (grid-stride; every thread of the CTA).
template <typename RowFn>
__device__ __forceinline__ void for_each_long_row(const int32_t* control, const int32_t* long_rows,
                                                  RowFn&& row_fn) {
  const int count = control[1];
  for (int i = blockIdx.x; i < count; i += gridDim.x) row_fn(int64_t(long_rows[i]));
}

}  // namespace twell::gpu::warp_rows
