// The per-neuron (column) view of the compact entries of the saved layout, built on the device by
// a stable counting sort: each entry's position among its neuron's entries, such that
// records[col_ptr[n] .. col_ptr[n+1]) are neuron n's entries in ascending row order once the
// backward rows store them there, and `heavy`, the neurons whose weight gradients are split over
// a CTA. No order-dependent atomics: the result is the same every run.
//   count:   CTA (row block b, tile t): counts each neuron of tile t over the block's compact rows
//            (shared-memory integer atomics) -> block_counts[b, n]. thread i: row i's entry count
//            (all loads in flight at once); a scan of them numbers the block's entries, and
//            thread j then takes entries j, j + 256, ... (its row found by binary search), so a
//            CTA waits on a few loads, not on one per row.
//   offsets: thread per neuron: exclusive prefix of block_counts[., n] over the row blocks, loaded
//            kOffsetBatch at a time -> the block's start inside the neuron's range, and the total.
//   col_ptr: the only CTA: the heavy threshold from the mean total (one reduction), then one
//            exclusive scan per kScanThreads neurons of the totals and heavy flags packed together.
//   rank:    CTA (b, t), its entries numbered and taken as in count. Each entry sets its row's
//            bit in a per-neuron mask of its 64-row chunk; an entry's rank among its neuron's
//            entries of the block is the bits of the earlier chunks' masks and the lower bits of
//            its own, so rows stay ascending. It writes its position (the block's offset in the
//            neuron's range plus the rank) at its slot: the backward rows kernels, which compute
//            the entry's coefficients, store its record at col_ptr[n] + position.
#include <algorithm>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/scan.cuh"
#include "cuda/kernels/common/train_device.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/training.hpp"
#include "cuda/policy/train_config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

using Cfg = ColumnIndexConfig;

static_assert(Cfg::kThreads % kWarpSize == 0 && Cfg::kScanThreads % kWarpSize == 0 &&
                  Cfg::kScanThreads <= 1024 && Cfg::kThreads <= 1024,
              "whole warps within the CTA size limit");
static_assert(Cfg::kChunkRows == 64, "a chunk's rows are the bits of one uint64 mask");
static_assert(Cfg::kRowsPerBlock % Cfg::kChunkRows == 0, "a row block is whole chunks");

// The rows [first, last) of row block b.
struct RowRange {
  int64_t first;
  int64_t last;
};
__device__ __forceinline__ RowRange block_rows(int64_t b, int64_t rows) {
  const int64_t first = b * Cfg::kRowsPerBlock;
  return {first, first + Cfg::kRowsPerBlock < rows ? first + Cfg::kRowsPerBlock : rows};
}

static_assert(Cfg::kThreads == Cfg::kRowsPerBlock, "count and rank: one thread per row of the block");
constexpr int kChunks = Cfg::kRowsPerBlock / Cfg::kChunkRows;

// The block's entries of one tile, numbered row by row: start[i] is the first number of row i's
// entries (start[kRowsPerBlock] the block's total); routed rows and rows past M have none.
struct BlockEntries {
  int32_t start[Cfg::kRowsPerBlock + 1];
  scan::ScanShared scan;
};

// Every thread: loads its row's entry count, scans; returns the total. Synchronises the CTA.
__device__ __forceinline__ int32_t number_entries(const TwellView& tw, const RowRange& range, int tile,
                                                  int tiles, BlockEntries& sm) {
  const int64_t r = range.first + threadIdx.x;
  int32_t mine = 0;
  if (r < range.last) {
    const int32_t slot = tw.row_slot[r];
    const int32_t entries = tw.counts[r * tiles + tile];
    mine = slot < 0 ? entries : 0;
  }
  int64_t total = 0;
  const int64_t before = scan::exclusive_scan(mine, sm.scan, total);
  sm.start[threadIdx.x] = int32_t(before);
  if (threadIdx.x == 0) sm.start[Cfg::kRowsPerBlock] = int32_t(total);
  __syncthreads();
  return int32_t(total);
}

// The row (of the block) holding entry j < total: the last i with start[i] <= j.
__device__ __forceinline__ int row_of_entry(const BlockEntries& sm, int32_t j) {
  int lo = 0, hi = Cfg::kRowsPerBlock;  // start[lo] <= j < start[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (sm.start[mid] <= j)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// Entry j < total of the block's tile: its row within the block and its slot in the layout.
struct BlockEntry {
  int row;
  int64_t slot;
};
__device__ __forceinline__ BlockEntry block_entry(const BlockEntries& sm, const RowRange& range, int tile,
                                                  int tiles, int capacity, int32_t j) {
  const int i = row_of_entry(sm, j);
  return {i, ((range.first + i) * tiles + tile) * int64_t(capacity) + (j - sm.start[i])};
}

__global__ void __launch_bounds__(Cfg::kThreads)
    count_kernel(TwellView tw, int32_t* __restrict__ block_counts) {
  chain_entry();
  __shared__ int32_t count[kMaxTileWidth];
  __shared__ BlockEntries sm;
  const int tile = blockIdx.y;
  const int tiles = tiles_of(tw.shape);
  const int width = tile_width(tw.shape, tile);
  const RowRange range = block_rows(blockIdx.x, tw.shape.rows);
  for (int j = threadIdx.x; j < width; j += blockDim.x) count[j] = 0;
  const int32_t total = number_entries(tw, range, tile, tiles, sm);  // synchronises: count[] is zero

  for (int32_t j = threadIdx.x; j < total; j += blockDim.x)
    atomicAdd(&count[tw.cols[block_entry(sm, range, tile, tiles, tw.shape.capacity, j).slot]], 1);
  __syncthreads();
  int32_t* out = block_counts + int64_t(blockIdx.x) * tw.shape.cols + int64_t(tile) * tw.shape.tile;
  for (int j = threadIdx.x; j < width; j += blockDim.x) out[j] = count[j];
}

__global__ void __launch_bounds__(Cfg::kOffsetThreads)
    offsets_kernel(int32_t* __restrict__ block_counts, int64_t blocks, int64_t cols,
                   int32_t* __restrict__ col_totals) {
  chain_entry();
  constexpr int kBatch = Cfg::kOffsetBatch;
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= cols) return;
  int32_t running = 0;
  for (int64_t b0 = 0; b0 < blocks; b0 += kBatch) {
    int32_t mine[kBatch];  // a batch of loads in flight before the stores that follow them
#pragma unroll
    for (int i = 0; i < kBatch; ++i) mine[i] = b0 + i < blocks ? block_counts[(b0 + i) * cols + n] : 0;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (b0 + i < blocks) block_counts[(b0 + i) * cols + n] = running;
      running += mine[i];
    }
  }
  col_totals[n] = running;
}

// Packs a neuron's entry count and heavy flag into one scan operand: the flag sum (at most
// kMaxIntermediate < 2^kFlagBits) never carries into the counts (at most 2^34 over all neurons).
constexpr int kFlagBits = 20;
static_assert((int64_t(1) << kFlagBits) > ShapeLimits::kMaxIntermediate, "the heavy count fits its bits");

__global__ void __launch_bounds__(Cfg::kScanThreads)
    col_ptr_kernel(const int32_t* __restrict__ col_totals, int64_t cols, int64_t* __restrict__ col_ptr,
                   int32_t* __restrict__ heavy) {
  chain_entry();
  using WG = WeightGradConfig;
  __shared__ scan::ScanShared sm;
  // The mean needs only the sum: every thread adds its own neurons (loads all in flight), one scan.
  int64_t mine_sum = 0;
  for (int64_t n = threadIdx.x; n < cols; n += Cfg::kScanThreads) mine_sum += col_totals[n];
  int64_t all = 0;
  scan::exclusive_scan(mine_sum, sm, all);
  __syncthreads();
  const int64_t mean_times = WG::kHeavyFactor * all / (cols > 0 ? cols : 1);
  const int64_t threshold = mean_times > WG::kHeavyMin ? mean_times : WG::kHeavyMin;
  constexpr int64_t kFlagMask = (int64_t(1) << kFlagBits) - 1;
  int64_t base = 0, heavy_base = 0;
  for (int64_t n0 = 0; n0 < cols; n0 += Cfg::kScanThreads) {
    const int64_t n = n0 + threadIdx.x;
    const int32_t mine = n < cols ? col_totals[n] : 0;
    const bool is_heavy = mine > threshold;
    int64_t total = 0;
    const int64_t before = scan::exclusive_scan((int64_t(mine) << kFlagBits) | (is_heavy ? 1 : 0), sm, total);
    if (n < cols) col_ptr[n] = base + (before >> kFlagBits);
    if (is_heavy) heavy[2 + heavy_base + (before & kFlagMask)] = int32_t(n);
    base += total >> kFlagBits;
    heavy_base += total & kFlagMask;
    __syncthreads();  // sm is rewritten by the next scan
  }
  if (threadIdx.x == 0) {
    col_ptr[cols] = base;
    heavy[0] = int32_t(heavy_base);
    heavy[1] = int32_t(threshold < INT32_MAX ? threshold : INT32_MAX);  // a count <= M < INT32_MAX
  }
}

__global__ void __launch_bounds__(Cfg::kThreads)
    rank_kernel(TwellView tw, const int32_t* __restrict__ block_counts, int32_t* __restrict__ position) {
  chain_entry();
  __shared__ int32_t first[kMaxTileWidth];                     // the block's first position per neuron
  __shared__ unsigned long long mask[kChunks][kMaxTileWidth];  // bit i: row i of the chunk has the neuron
  __shared__ BlockEntries sm;
  const int tile = blockIdx.y;
  const int tiles = tiles_of(tw.shape);
  const int width = tile_width(tw.shape, tile);
  const int capacity = tw.shape.capacity;
  const RowRange range = block_rows(blockIdx.x, tw.shape.rows);
  const int64_t n0 = int64_t(tile) * tw.shape.tile;
  for (int j = threadIdx.x; j < width; j += blockDim.x) {
    first[j] = block_counts[int64_t(blockIdx.x) * tw.shape.cols + n0 + j];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) mask[c][j] = 0;
  }
  const int32_t total = number_entries(tw, range, tile, tiles, sm);  // synchronises: masks are zero

  for (int32_t j = threadIdx.x; j < total; j += blockDim.x) {
    const BlockEntry e = block_entry(sm, range, tile, tiles, capacity, j);
    atomicOr(&mask[e.row / Cfg::kChunkRows][tw.cols[e.slot]], 1ull << (e.row % Cfg::kChunkRows));
  }
  __syncthreads();
  for (int32_t j = threadIdx.x; j < total; j += blockDim.x) {
    const BlockEntry e = block_entry(sm, range, tile, tiles, capacity, j);
    const int col = tw.cols[e.slot];
    const int chunk = e.row / Cfg::kChunkRows;
    int rank = __popcll(mask[chunk][col] & ((1ull << (e.row % Cfg::kChunkRows)) - 1));
    for (int c = 0; c < chunk; ++c) rank += __popcll(mask[c][col]);
    position[e.slot] = first[col] + rank;
  }
}

}  // namespace

int64_t column_index_blocks(int64_t rows) { return (rows + Cfg::kRowsPerBlock - 1) / Cfg::kRowsPerBlock; }

void launch_column_index(const ColumnIndexArgs& a, cudaStream_t s) {
  const char* op = "TrainingPlan::backward";
  const TwellShape& shape = a.saved.shape;
  const int64_t blocks = column_index_blocks(shape.rows);
  if (blocks == 0) return;
  const dim3 grid(unsigned(blocks), unsigned(shape.num_tiles()));
  launch(count_kernel, dim3(grid), dim3(Cfg::kThreads), 0, s, a.saved, a.block_counts);
  check_launch(op, "column index count kernel");
  const int64_t offset_ctas = (shape.cols + Cfg::kOffsetThreads - 1) / Cfg::kOffsetThreads;
  launch(offsets_kernel, dim3(unsigned(offset_ctas)), dim3(Cfg::kOffsetThreads), 0, s, a.block_counts, blocks,
         shape.cols, a.col_totals);
  check_launch(op, "column index offsets kernel");
  launch(col_ptr_kernel, dim3(1), dim3(Cfg::kScanThreads), 0, s, a.col_totals, shape.cols, a.col_ptr,
         a.heavy);
  check_launch(op, "column index scan kernel");
  launch(rank_kernel, dim3(grid), dim3(Cfg::kThreads), 0, s, a.saved, a.block_counts, a.position);
  check_launch(op, "column index rank kernel");
}

}  // namespace twell::gpu
