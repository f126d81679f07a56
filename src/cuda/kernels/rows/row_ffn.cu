// Up + down over compact rows (K a multiple of 256):
//   row kernel (rows::warp_row_kernel with RowPass): CTA = RowConfig::kWarps warps of a persistent
//     grid; a warp takes compact rows from a queue, one at a time: its x row and fp32
//     accumulators in registers; 32 TwELL entries decoded at once (one per lane), consumed two at
//     a time (dot with Wu rows, warp butterfly, axpy of Wd rows). Rows over the run's long-row
//     limit (KernelArgs::long_row, at most kLongRow) are listed for the long-row kernels. Gated
//     (N >= 2 kLongRow): run as two kernels, a dots phase (h = g * dot in fp32, kept in the row's
//     dead G row) and an axpys phase (Wd), so each streams one weight matrix (warp_rows::Phase);
//     the first dots pass writes the zero y rows of rows without entries, which the axpys skip.
//   column ranges: K over RowConfig::kMaxHidden (the columns a lane's registers hold) runs each
//     kernel once per range of K, each launch with its own queue. The dots passes add their
//     partial dots into h in range order (the last multiplies by g); the axpys passes (and a
//     plain layer's fused passes, h = g) each write their columns of y.
//   long-row kernel (one range): a CTA takes a long compact row or a routed row. Long compact
//     rows: every warp walks the same sequence of neuron pairs and takes every kWarps-th. Routed
//     rows: warp 0 gathers the row's active neurons from G into shared memory (kAhead vectors in
//     flight per lane, a warp scan per 256 columns), then warp w consumes groups w, w + kWarps, ...
//     of 32. Partial sums are added in shared memory in warp order (deterministic). Rows over
//     a.dense_row active neurons go to the tensor-core backup instead (compact ones written densely
//     into their G rows first).
//   long-row passes (several ranges): the same split of a long compact row's neuron pairs over a
//     CTA's warps, per phase and range; the first lists every routed row and every long row over
//     a.dense_row entries (written densely into its G row) for the tensor-core backup, which the
//     other passes skip.
//   thread: 8 consecutive columns of every 256-column chunk of its range (16-byte loads).
#include <algorithm>
#include <string>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/inference.hpp"
#include "cuda/kernels/rows/warp_row_kernel.cuh"
#include "cuda/kernels/rows/warp_rows.cuh"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

using warp_rows::Phase;

// The row's x slice and accumulators, and the pairwise up/down step over active neurons.
template <typename T, FfnKind kKind, int kChunks, Phase kPhase = Phase::fused>
struct RowState {
  static constexpr bool kDots = kPhase != Phase::axpys;
  static constexpr bool kAxpys = kPhase != Phase::dots;
  uint4 x[kDots ? kChunks : 1];
  float acc[kAxpys ? kChunks : 1][kVecElems];
  int pair = 0;    // neuron pairs seen so far
  int stride = 1;  // this warp runs pairs offset, offset + stride, ...
  int offset = 0;
  float* h = nullptr;  // split phases: the row's h values, one per entry in TwELL order
  int entry = 0;       // split phases: entries seen so far
  bool first = true;   // dots passes: the first (writes the partial dots) and the last
  bool last = true;    //   (multiplies their sum by g) of the column ranges of K

  __device__ void load(const T* xrow, int lane) {
    if constexpr (kDots) warp_rows::load_row<T, kChunks>(xrow, lane, x);
    if constexpr (kAxpys) warp_rows::zero(acc);
  }

  // h = g * dot(x, Wu[n]) (gated) or g (plain) for two neurons, then acc += h * Wd[n].
  __device__ void step(const T* up, const T* down, int64_t k, int n0, float g0, int n1, float g1,
                       bool two, int lane) {
    if (pair++ % stride != offset) {  // another warp's pair (long rows)
      if constexpr (kPhase != Phase::fused) entry += two ? 2 : 1;
      return;
    }
    float h0 = g0, h1 = two ? g1 : 0.0f;
    if constexpr (kPhase == Phase::axpys) {
      h0 = h[entry];
      h1 = two ? h[entry + 1] : 0.0f;
      entry += two ? 2 : 1;
    } else if constexpr (kKind == FfnKind::gated) {
      float d0, d1;
      warp_rows::dot2<T, kChunks>(x, up + int64_t(n0) * k, up + int64_t(n1) * k, lane, d0, d1);
      if (kPhase != Phase::dots || (first && last)) {
        h0 *= d0;
        h1 *= d1;
      } else {
        // Column ranges of K: the partial dots summed in range order in h, times g at the last.
        if (!first && lane == 0) {
          d0 += h[entry];
          if (two) d1 += h[entry + 1];
        }
        h0 = last ? h0 * d0 : d0;
        h1 = last ? h1 * d1 : d1;
      }
    }
    if constexpr (kPhase == Phase::dots) {
      if (lane == 0) {
        h[entry] = h0;
        if (two) h[entry + 1] = h1;
      }
      entry += two ? 2 : 1;
    } else {
      warp_rows::axpy2<T, kChunks>(acc, h0, down + int64_t(n0) * k, h1, down + int64_t(n1) * k, lane);
    }
  }

  // Consumes `count` (<= 32) entries held one per lane (neuron, g), two at a time.
  __device__ void consume(const T* up, const T* down, int64_t k, int neuron, float g, int count,
                          int lane) {
    warp_rows::for_each_lane_pair(count, [&](const warp_rows::LanePair& p) {
      const int n0 = p.first(neuron);
      const float g0 = p.first(g);
      const int n1 = p.second(neuron);
      const float g1 = p.second(g);
      step(up, down, k, n0, g0, n1, g1, p.two(), lane);
    });
  }

  __device__ void store(T* yrow, int lane) const { warp_rows::store_row<T, kChunks>(yrow, lane, acc); }
};

// Compact row: its entries decoded 32 at a time (warp_rows.cuh), consumed two at a time.
template <typename T, FfnKind kKind, int kChunks, Phase kPhase>
__device__ void compact_row(RowState<T, kKind, kChunks, kPhase>& st, const TwellView& tw, const T* up,
                            const T* down, int64_t k, int64_t row, int lane) {
  const auto* values = static_cast<const T*>(tw.values);
  warp_rows::for_each_entry_group(tw, row, lane, [&](int neuron, int64_t slot, int count) {
    const float g = slot >= 0 ? Elem<T>::to_float(values[slot]) : 0.0f;
    st.consume(up, down, k, neuron, g, count, lane);
  });
}

struct KernelArgs {
  const void* x;
  const void* up;
  const void* down;
  void* y;
  int64_t k;
  TwellView tw;
  const void* hidden;
  int32_t* heavy_rows;
  int32_t* long_rows;
  RunCounters* control;
  // The row kernels' column range of K (passes): its first column, its queue, and whether it is
  // the first (lists the long rows; the dots write) and the last range.
  int64_t col0 = 0;
  int32_t* head = nullptr;
  bool first = true;
  bool last = true;
  // Rows with more active neurons than this go to the tensor-core backup (RowConfig::kDenseRowDivisor).
  int dense_row = RowConfig::kMaxDenseRow;
  // Compact rows of more entries than this go to the long-row kernels (RowArgs::long_row).
  int long_row = RowConfig::kLongRow;
  // Split phases: the first dots pass writes the zero y rows of rows without entries (beside the
  // gate, when overlapped), which the axpys passes then skip.
  bool zero_empty = false;
  // Overlap (RowArgs::ready): the first dots pass waits for each row's block.
  const int32_t* ready = nullptr;
  int32_t ready_target = 0;
};

// Writes compact row `row` densely into its G row (zeros, then its entries' g values) for the
// tensor-core backup, with `threads` threads of index `tid` (a warp or the CTA) and `sync` their
// barrier. The G row of a compact row is dead (the pack has read it; the fused gate never writes
// it) and the row kernels leave rows this long to the backup, so nothing else touches it.
template <typename T, typename Sync>
__device__ void densify_row(const TwellView& tw, int64_t row, T* g_row, int tid, int threads, Sync&& sync) {
  const int64_t cols = tw.shape.cols, tile = tw.shape.tile, capacity = tw.shape.capacity;
  const int64_t num_tiles = (cols + tile - 1) / tile;
  for (int64_t c = int64_t(tid) * kVecElems; c < cols; c += int64_t(threads) * kVecElems)
    *reinterpret_cast<uint4*>(g_row + c) = make_uint4(0, 0, 0, 0);
  sync();
  const auto* values = static_cast<const T*>(tw.values);
  const int lane = tid % kWarpSize;
  for (int64_t t = tid / kWarpSize; t < num_tiles; t += threads / kWarpSize) {
    const int64_t index = row * num_tiles + t;
    const int count = tw.counts[index];
    for (int e = lane; e < count; e += kWarpSize)
      g_row[t * tile + tw.cols[index * capacity + e]] = values[index * capacity + e];
  }
}

// One warp gathers the active neurons of a row of G into `list` (column order, as (neuron, g bits)
// pairs) while counting them, and stops once the row has more than kLimit. Returns the count
// (identical in every lane); above kLimit the list is incomplete.
template <int kLimit, typename T>
__device__ int gather_row(const T* g_row, int64_t n, int2* list, int lane) {
  constexpr int kAhead = 4;  // 16-byte vectors of G in flight per lane
  int total = 0;
  for (int64_t c0 = 0; c0 < n; c0 += kAhead * RowConfig::kChunk) {
    uint4 v[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int64_t c = c0 + j * RowConfig::kChunk + int64_t(lane) * kVecElems;
      v[j] = c < n ? load_readonly(g_row + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int cnt = nonzero_count(v[j]);
      int incl = cnt;  // inclusive prefix sum over the lanes
#pragma unroll
      for (int s = 1; s < kWarpSize; s <<= 1) {
        const int o = __shfl_up_sync(kFullMask, incl, s);
        if (lane >= s) incl += o;
      }
      const int chunk_total = __shfl_sync(kFullMask, incl, kWarpSize - 1);
      if (total + chunk_total <= kLimit && cnt > 0) {
        const uint32_t words[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
        int slot = total + incl - cnt;
        const int col = int(c0 + j * RowConfig::kChunk) + lane * kVecElems;
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) {
          const uint32_t bits = e % 2 ? words[e / 2] >> 16 : words[e / 2] & 0xffffu;
          if (bits & kMagnitudeBits)
            list[slot++] = make_int2(col + e, __float_as_int(Elem<T>::to_float(*reinterpret_cast<const T*>(&bits))));
        }
      }
      total += chunk_total;
    }
    if (total > kLimit) return total;
  }
  return total;
}

// Consumes list[first + 32 g] for the groups g = group0, group0 + step, ... of a list of `total`.
template <typename T, FfnKind kKind, int kChunks>
__device__ void consume_list(RowState<T, kKind, kChunks>& st, const int2* list, int total, int group0,
                             int step, const T* up, const T* down, int64_t k, int lane) {
  for (int e0 = group0 * kWarpSize; e0 < total; e0 += step * kWarpSize) {
    const int2 entry = e0 + lane < total ? list[e0 + lane] : make_int2(0, 0);
    st.consume(up, down, k, entry.x, __int_as_float(entry.y), min(kWarpSize, total - e0), lane);
  }
}

// The row kernel: inference's pass of rows::warp_row_kernel, over one column range of K. Split
// phases keep a row's h values in its own G row (dead for compact rows: the pack has read it, the
// fused gate never writes it): kLongRow floats need N >= 2 kLongRow. Overlapped (a.ready), the
// first range runs beside the gate and waits for each row's block before reading the row. A routed
// row is the long-row kernel's or the backup's; the overflow routing runs after this kernel, so
// its rows are still marked kOverflowRow and skipped alike. The first range lists the long rows.
struct RowPass {
  using Args = KernelArgs;
  static constexpr int kWarps = RowConfig::kWarps;
  static constexpr int kMinCtasPerSm = 0;  // no cap: a fused pass at K = 2048 takes up to 248 registers

  static __device__ int long_row(const Args& a) { return a.long_row; }

  static __device__ void enter(const Args& a) {
    if (a.ready != nullptr)
      chain_without_wait();  // runs beside the gate: waits per row block instead
    else
      chain_entry();
  }

  template <Phase kPhase>
  static __device__ warp_rows::RowQueue queue(const Args& a) {
    return {a.head, kPhase != Phase::axpys && a.first ? a.long_rows : nullptr, &a.control->num_long};
  }

  static __device__ void wait(const Args& a, int64_t row, int64_t& known, int lane) {
    if (a.ready != nullptr) warp_rows::wait_for_block(a.ready, a.ready_target, row, known, lane);
  }

  // Split phases: the first dots pass writes an empty row's whole zero y row (every range of K);
  // every other pass then has nothing to do for it.
  template <typename T, Phase kPhase>
  static __device__ bool empty_row(const Args& a, int64_t row, int lane) {
    if (kPhase == Phase::fused || !a.zero_empty) return false;
    if (kPhase == Phase::dots && a.first) {
      T* yrow = static_cast<T*>(a.y) + row * a.k;
      for (int64_t c = warp_rows::lane_col(lane); c < a.k; c += RowConfig::kChunk)
        *reinterpret_cast<uint4*>(yrow + c) = make_uint4(0, 0, 0, 0);
    }
    return true;
  }

  template <typename T, FfnKind kKind, int kChunks, Phase kPhase>
  static __device__ void row(const Args& a, int64_t row, int lane, float (&acc)[kChunks][kVecElems], float&) {
    RowState<T, kKind, kChunks, kPhase> st;
    if constexpr (kPhase != Phase::fused)
      st.h = reinterpret_cast<float*>(const_cast<T*>(static_cast<const T*>(a.hidden)) + row * a.tw.shape.cols);
    st.first = a.first;
    st.last = a.last;
    st.load(static_cast<const T*>(a.x) + row * a.k + a.col0, lane);
    compact_row(st, a.tw, static_cast<const T*>(a.up) + a.col0, static_cast<const T*>(a.down) + a.col0, a.k, row,
                lane);
    if constexpr (kPhase != Phase::dots) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) acc[c][e] = st.acc[c][e];
    }
  }

  template <typename T, int kChunks>
  static __device__ void store(const Args& a, int64_t row, int lane, const float (&acc)[kChunks][kVecElems],
                               float) {
    warp_rows::store_row<T, kChunks>(static_cast<T*>(a.y) + row * a.k + a.col0, lane, acc);
  }
};

// K in several column ranges: a CTA per long compact row (from the row kernel's list, through a
// queue), its warps taking every kWarps-th neuron pair of the row in one range. Dots: each warp
// adds its entries' partial dots into h (no reduction). Axpys and fused: the warps' partial sums
// of the range's y columns meet in shared memory in warp order (deterministic).
template <typename T, FfnKind kKind, int kChunks, Phase kPhase>
__global__ void __launch_bounds__(RowConfig::kWarps * kWarpSize) long_pass_kernel(KernelArgs a) {
  chain_entry();
  constexpr bool kAxpys = kPhase != Phase::dots;
  constexpr int kCols = kChunks * RowConfig::kChunk;
  __shared__ float partial[kAxpys ? RowConfig::kWarps : 1][kAxpys ? kCols : 1];
  __shared__ int item;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const TwellView& tw = a.tw;
  const auto* up = static_cast<const T*>(a.up) + a.col0;
  const auto* down = static_cast<const T*>(a.down) + a.col0;
  // The run's first long-row pass also hands the backup its rows: the routed ones (items past
  // the long rows) and the long rows over a.dense_row entries, which it writes densely into G.
  const bool lists = a.first && kPhase != Phase::axpys;
  const int num_long = a.control->num_long;
  const int items = lists ? num_long + *tw.num_routed : num_long;
  for (;;) {
    if (threadIdx.x == 0) item = atomicAdd(a.head, 1);
    __syncthreads();
    const int q = item;
    if (q >= items) return;
    const int64_t row = q < num_long ? a.long_rows[q] : tw.routed_rows[q - num_long];
    if (q >= num_long || warp_rows::row_entries(tw, row, lane) > a.dense_row) {
      if (lists && q < num_long)
        densify_row(tw, row, const_cast<T*>(static_cast<const T*>(a.hidden)) + row * tw.shape.cols,
                    int(threadIdx.x), int(blockDim.x), [] { __syncthreads(); });
      if (lists && threadIdx.x == 0) a.heavy_rows[atomicAdd(&a.control->num_heavy, 1)] = int32_t(row);
      __syncthreads();  // item is rewritten for the next row
      continue;
    }
    RowState<T, kKind, kChunks, kPhase> st;
    st.stride = RowConfig::kWarps;
    st.offset = warp;
    st.first = a.first;
    st.last = a.last;
    if constexpr (kPhase != Phase::fused)
      st.h = reinterpret_cast<float*>(const_cast<T*>(static_cast<const T*>(a.hidden)) + row * tw.shape.cols);
    st.load(static_cast<const T*>(a.x) + row * a.k + a.col0, lane);
    compact_row(st, tw, up, down, a.k, row, lane);
    if constexpr (kAxpys) {
      warp_rows::sum_warps<T>(partial, warp, lane, st.acc, static_cast<T*>(a.y) + row * a.k + a.col0);
    }
    __syncthreads();  // item (and partial) are rewritten for the next row
  }
}

// A CTA per item: long compact rows (TwELL entries, every kWarps-th neuron pair per warp) and rows
// read from G (routed rows): warp 0 gathers the active neurons into
// shared memory, each warp consumes every kWarps-th group of 32. Partial sums meet in shared
// memory in warp order (deterministic).
template <typename T, FfnKind kKind, int kChunks>
__global__ void __launch_bounds__(RowConfig::kWarps * kWarpSize) long_row_kernel(KernelArgs a) {
  chain_entry();
  constexpr int kCols = kChunks * RowConfig::kChunk;
  __shared__ float partial[RowConfig::kWarps][kCols];
  __shared__ int2 list[RowConfig::kMaxDenseRow];
  __shared__ int64_t item_row;
  __shared__ bool item_from_g;
  __shared__ int item_total;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const TwellView& tw = a.tw;
  const auto* up = static_cast<const T*>(a.up);
  const auto* down = static_cast<const T*>(a.down);
  const int num_long = a.control->num_long, num_routed = *tw.num_routed;
  for (;;) {
    if (threadIdx.x == 0) {
      const int q = atomicAdd(&a.control->next_long, 1);
      item_from_g = q >= num_long;
      item_row = q < num_long ? a.long_rows[q] : q < num_long + num_routed ? tw.routed_rows[q - num_long] : -1;
    }
    __syncthreads();
    const int64_t row = item_row;
    const bool from_g = item_from_g;
    if (row < 0) return;
    if (warp == 0) {
      const int total = from_g ? gather_row<RowConfig::kMaxDenseRow>(
                                     static_cast<const T*>(a.hidden) + row * tw.shape.cols, tw.shape.cols, list, lane)
                               : warp_rows::row_entries(tw, row, lane);
      if (lane == 0) {
        item_total = total;
        if (total > a.dense_row)  // the tensor-core backup's
          a.heavy_rows[atomicAdd(&a.control->num_heavy, 1)] = int32_t(row);
      }
    }
    __syncthreads();  // the item and its list are complete; thread 0 may take the next item after
                      // the barrier below
    const int total = item_total;
    if (total > a.dense_row) {
      if (!from_g)
        densify_row(tw, row, const_cast<T*>(static_cast<const T*>(a.hidden)) + row * tw.shape.cols,
                    int(threadIdx.x), int(blockDim.x), [] { __syncthreads(); });
      __syncthreads();
      continue;
    }
    RowState<T, kKind, kChunks> st;
    st.load(static_cast<const T*>(a.x) + row * a.k, lane);
    if (from_g) {
      consume_list(st, list, total, warp, RowConfig::kWarps, up, down, a.k, lane);
    } else {
      st.stride = RowConfig::kWarps;
      st.offset = warp;
      compact_row(st, tw, up, down, a.k, row, lane);
    }
    warp_rows::sum_warps<T>(partial, warp, lane, st.acc, static_cast<T*>(a.y) + row * a.k);
    __syncthreads();  // partial, list and the item are rewritten by the next item
  }
}

// Column ranges of K for the row kernels: the fewest of at most kMaxHidden columns, in balanced
// whole chunks. (More, narrower ranges whose weight slabs would fit L2 ran slower: on an H200 at
// K = 4096, N = 11008, two ranges beat four and eight, each pass re-walking every row's entries.)
int num_passes(int64_t k) { return int((k + RowConfig::kMaxHidden - 1) / RowConfig::kMaxHidden); }

// One kernel per column range of K: the row kernel's (kLong false) or the long rows' (true).
template <typename T, FfnKind kKind, Phase kPhase, bool kLong>
void launch_passes(KernelArgs k, int64_t ctas, int32_t* queues, cudaStream_t s) {
  const int chunks = int(k.k / RowConfig::kChunk);
  const int passes = num_passes(k.k);
  for (int p = 0; p < passes; ++p) {
    const int c0 = int(int64_t(chunks) * p / passes), c1 = int(int64_t(chunks) * (p + 1) / passes);
    k.col0 = int64_t(c0) * RowConfig::kChunk;
    k.head = queues + p;
    k.first = p == 0;
    k.last = p == passes - 1;
    if (p > 0) k.ready = nullptr;  // only the first pass runs beside the gate
    warp_rows::with_chunks(c1 - c0, [&](auto chunks_c) {
      constexpr int kChunks = decltype(chunks_c)::value;
      constexpr int kThreads = RowConfig::kWarps * kWarpSize;
      if constexpr (kLong)
        launch(long_pass_kernel<T, kKind, kChunks, kPhase>, dim3(unsigned(ctas)), dim3(kThreads), 0, s, k);
      else
        launch(rows::warp_row_kernel<RowPass, T, kKind, kChunks, kPhase>, dim3(unsigned(ctas)), dim3(kThreads), 0, s,
               k);
    });
  }
}

template <typename T, FfnKind kKind>
void launch_with(const RowArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const CompactArgs& c = a.compact;
  KernelArgs k{c.x,           c.up,         c.down,      c.y,       c.hidden, c.twell,
               a.hidden,      a.heavy_rows, a.long_rows, a.control};
  k.dense_row = int(std::clamp<int64_t>(c.twell.shape.cols / RowConfig::kDenseRowDivisor, RowConfig::kLongRow,
                                        RowConfig::kMaxDenseRow));
  k.long_row = int(std::clamp<int64_t>(a.long_row, 0, RowConfig::kLongRow));
  k.zero_empty = row_kernel_splits(kKind, c.twell.shape.cols);
  const int64_t ctas = std::min<int64_t>(
      int64_t(dev.sm_count) * RowConfig::kCtasPerSm,
      (c.twell.shape.rows + RowConfig::kWarps - 1) / RowConfig::kWarps);
  // Queue heads: row kernel dots (or fused) 0, axpys 1; long-row passes dots (or fused) 2, axpys 3.
  auto queues = [&a](int set) { return a.control->row_queue + set * RowConfig::kMaxPasses; };
  const bool split = row_kernel_splits(kKind, c.twell.shape.cols);
  const bool fused_long = row_kernel_routes(c.hidden);  // one range: long and routed rows fused
  // The long rows are listed by the first range's row kernel, so the long-row passes follow it.
  if constexpr (kKind == FfnKind::gated) {
    if (split) {
      k.ready = a.ready;
      k.ready_target = a.ready_target;
      launch_passes<T, kKind, Phase::dots, false>(k, ctas, queues(0), s);
      k.ready = nullptr;
      if (a.route_overflow)  // the overlapped gate's marks, read by the dots passes' row test
        launch_route_overflow(c.twell, const_cast<void*>(a.hidden), dev, s, "InferencePlan::run");
      if (!fused_long) launch_passes<T, kKind, Phase::dots, true>(k, ctas, queues(2), s);
      launch_passes<T, kKind, Phase::axpys, false>(k, ctas, queues(1), s);
      if (!fused_long) launch_passes<T, kKind, Phase::axpys, true>(k, ctas, queues(3), s);
    } else {  // one range (row_kernel_supports)
      launch_passes<T, kKind, Phase::fused, false>(k, ctas, queues(0), s);
    }
  } else {
    launch_passes<T, kKind, Phase::fused, false>(k, ctas, queues(0), s);
    if (!fused_long) launch_passes<T, kKind, Phase::fused, true>(k, ctas, queues(2), s);
  }
  if (fused_long) {
    warp_rows::with_chunks(int(c.hidden / RowConfig::kChunk), [&](auto chunks_c) {
      constexpr int kChunks = decltype(chunks_c)::value;
      launch(long_row_kernel<T, kKind, kChunks>, dim3(unsigned(ctas)), dim3(RowConfig::kWarps * kWarpSize), 0,
             s, k);
    });
  }
}

}  // namespace

bool row_kernel_routes(int64_t k) { return warp_rows::supports(k); }

bool row_kernel_splits(FfnKind kind, int64_t n) {
  return kind == FfnKind::gated && n >= 2 * RowConfig::kLongRow;
}

bool row_kernel_supports(FfnKind kind, int64_t k, int64_t n) {
  if (k % RowConfig::kChunk != 0 || k > ShapeLimits::kMaxHidden) return false;
  return kind == FfnKind::plain || k <= RowConfig::kMaxHidden || n >= 2 * RowConfig::kLongRow;
}

void launch_row_ffn(const RowArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const CompactArgs& c = a.compact;
  if (c.twell.shape.rows == 0) return;
  if (!row_kernel_supports(c.kind, c.hidden, c.twell.shape.cols))
    throw Error("InferencePlan::run", "hidden size K for the row kernel",
                "a multiple of 256 up to " + std::to_string(ShapeLimits::kMaxHidden) +
                    " (gated, K > " + std::to_string(RowConfig::kMaxHidden) + ": N >= " +
                    std::to_string(2 * RowConfig::kLongRow) + ")",
                std::to_string(c.hidden));
  if ((a.ready != nullptr || a.route_overflow) && !row_kernel_splits(c.kind, c.twell.shape.cols))
    throw Error("InferencePlan::run", "overlapped row stage",
                "a gated layer with N >= " + std::to_string(2 * RowConfig::kLongRow),
                std::to_string(c.twell.shape.cols));
  with_element_type(c.twell.dtype, "InferencePlan::run", [&](auto tag) {
    using T = decltype(tag);
    if (c.kind == FfnKind::gated)
      launch_with<T, FfnKind::gated>(a, dev, s);
    else
      launch_with<T, FfnKind::plain>(a, dev, s);
  });
  check_launch("InferencePlan::run", "row up+down kernel");
}

}  // namespace twell::gpu
