// Weight gradients of the compact entries, per neuron over the column index's records (written,
// not accumulated; the routed rows' dense contribution is added afterwards):
//   dWd[n] = sum h dy[m];  dW1[n] = sum dg x[m];  dWu[n] = sum du x[m] (gated)
// with h = g*u, dg = dh*u, du = dh*g (gated) or h = g, dg = dh (plain), fp32 accumulation. Every
// sum is taken in an order fixed by the column index (never by scheduling): deterministic.
//
// Warp kernel: the neurons with at most heavy[1] entries, in passes over WeightGradConfig::kChunkRows
// rows each (the first writes the sums, the others add theirs, in row order); a neuron's records
// of a pass are a contiguous range (rows ascend), found from the column index's block offsets.
//   grid: persistent; each warp takes the next item (256-column slice s, neuron n) from the pass's
//         queue, slice-major, so the x and dy columns in use (2 x 16 MB a pass) stay in L2.
//   warp: the item alone: 32 records loaded at once (one per lane), then their x / dy vectors
//         kBatch entries at a time (loads first); the sums are stored straight from registers.
//   thread: 8 consecutive columns of the slice: the fp32 accumulators of every gradient.
// Heavy kernel: the neurons listed in heavy (a neuron firing for many tokens would hold one warp
// for as long as the whole pass; heavy-tailed patterns have them).
//   grid: persistent, grid-stride over items (64-column quarter q, heavy neuron h), quarter-major.
//   CTA: the item; its kHeavyWarps x kHeavyGroups lane groups of 8 lanes split the neuron's
//        entries into as many contiguous runs; runs meet by shuffles (groups of a warp, in a fixed
//        pattern) and in shared memory (warps, in warp order).
//   lane group: 8 records at once (one per lane, the next 8 in flight), their x / dy vectors
//        kHeavyBatch entries at a time.
//   thread: 8 columns of the quarter.
#include <algorithm>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/train_device.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/training.hpp"
#include "cuda/policy/train_config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

using Cfg = WeightGradConfig;
constexpr int kSlice = kWarpSize * kVecElems;  // columns of K per warp item
constexpr int kThreads = Cfg::kWarps * kWarpSize;
constexpr int kGroupLanes = kWarpSize / Cfg::kHeavyGroups;
constexpr int kQuarter = kGroupLanes * kVecElems;  // columns of K per heavy item
constexpr int kHeavyThreads = Cfg::kHeavyWarps * kWarpSize;
constexpr int kRuns = Cfg::kHeavyWarps * Cfg::kHeavyGroups;
static_assert(kWarpSize % Cfg::kBatch == 0, "batches tile a group of 32 records");
static_assert(kGroupLanes % Cfg::kHeavyBatch == 0, "batches tile a lane group's 8 records");
static_assert(Cfg::kHeavyGroups == 4, "the lane groups of a warp meet by two xor shuffles (8, 16)");
static_assert(kHeavyThreads >= kQuarter, "the final sum gives a thread one column of the quarter");

struct Params {
  const void* x;
  const void* dy;
  int64_t n;
  int64_t k;
  const int64_t* col_ptr;
  const int32_t* heavy;
  const EntryRecord* records;
  const int32_t* block_offsets;  // [blocks, n]: block b's first record in each neuron's range
  int64_t blocks;                // column index row blocks
  int64_t first_block;           // this pass: row blocks [first_block, end_block)
  int64_t end_block;
  int32_t* queue;
  float* outs[3];  // first, down, up
};

template <FfnKind kKind>
__host__ __device__ constexpr int grads_of() {
  return kKind == FfnKind::gated ? 3 : 2;
}

// acc[0] += first x;  acc[1] += down dy;  acc[2] += up x (gated).
template <typename T, int kGrads>
__device__ __forceinline__ void accumulate(float (&acc)[3][kVecElems], const uint4& xv, const uint4& dyv,
                                           float first, float down, float up) {
  float xf[kVecElems], dyf[kVecElems];
  unpack8<T>(xv, xf);
  unpack8<T>(dyv, dyf);
#pragma unroll
  for (int e = 0; e < kVecElems; ++e) {
    acc[0][e] = fmaf(first, xf[e], acc[0][e]);
    acc[1][e] = fmaf(down, dyf[e], acc[1][e]);
    if constexpr (kGrads == 3) acc[2][e] = fmaf(up, xf[e], acc[2][e]);
  }
}

template <typename T, FfnKind kKind>
__global__ void __launch_bounds__(kThreads, Cfg::kCtasPerSm) weight_grads_warp_kernel(Params p) {
  chain_entry();
  constexpr int kGrads = grads_of<kKind>();
  const int lane = threadIdx.x % kWarpSize;
  const auto* x = static_cast<const T*>(p.x);
  const auto* dy = static_cast<const T*>(p.dy);
  const int64_t threshold = p.heavy[1];
  const int64_t items = (p.k + kSlice - 1) / kSlice * p.n;
  int32_t item = 0;
  if (lane == 0) item = atomicAdd(p.queue, 1);
  item = __shfl_sync(kFullMask, item, 0);
  while (item < items) {
    int32_t ahead = 0;  // the next item, fetched while this one runs
    if (lane == 0) ahead = atomicAdd(p.queue, 1);
    const int64_t slice = item / p.n, neuron = item - slice * p.n;
    const int64_t all_begin = p.col_ptr[neuron], all_end = p.col_ptr[neuron + 1];
    const int64_t begin = all_begin + (p.first_block > 0 ? p.block_offsets[p.first_block * p.n + neuron] : 0);
    const int64_t end =
        p.end_block < p.blocks ? all_begin + p.block_offsets[p.end_block * p.n + neuron] : all_end;
    if (all_end - all_begin <= threshold) {
      const int64_t col = slice * kSlice + lane * kVecElems;
      const bool in_k = col < p.k;
      float acc[3][kVecElems];
#pragma unroll
      for (int q = 0; q < 3; ++q)
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) acc[q][e] = 0.0f;
      for (int64_t j0 = begin; j0 < end; j0 += kWarpSize) {
        EntryRecord rec{0, 0.0f, 0.0f, 0.0f};  // past the end: row 0, zero coefficients
        if (j0 + lane < end) rec = p.records[j0 + lane];
        const int group = int(end - j0 < kWarpSize ? end - j0 : kWarpSize);
        for (int b0 = 0; b0 < group; b0 += Cfg::kBatch) {
          uint4 xv[Cfg::kBatch], dyv[Cfg::kBatch];
#pragma unroll
          for (int b = 0; b < Cfg::kBatch; ++b) {
            const int64_t offset = int64_t(__shfl_sync(kFullMask, rec.row, b0 + b)) * p.k + col;
            xv[b] = dyv[b] = make_uint4(0, 0, 0, 0);
            if (in_k && b0 + b < group) {
              xv[b] = load_readonly(x + offset);
              dyv[b] = load_readonly(dy + offset);
            }
          }
#pragma unroll
          for (int b = 0; b < Cfg::kBatch; ++b)  // zero coefficients past the group: adds +0
            accumulate<T, kGrads>(acc, xv[b], dyv[b], __shfl_sync(kFullMask, rec.first, b0 + b),
                                  __shfl_sync(kFullMask, rec.down, b0 + b),
                                  __shfl_sync(kFullMask, rec.up, b0 + b));
        }
      }
      if (in_k) {
#pragma unroll
        for (int q = 0; q < kGrads; ++q) {
          auto* out = reinterpret_cast<float4*>(p.outs[q] + neuron * p.k + col);
          if (p.first_block > 0) {  // the earlier passes' sums, then this pass's
            const float4 a = out[0], b = out[1];
            acc[q][0] = a.x + acc[q][0], acc[q][1] = a.y + acc[q][1], acc[q][2] = a.z + acc[q][2];
            acc[q][3] = a.w + acc[q][3], acc[q][4] = b.x + acc[q][4], acc[q][5] = b.y + acc[q][5];
            acc[q][6] = b.z + acc[q][6], acc[q][7] = b.w + acc[q][7];
          }
          out[0] = make_float4(acc[q][0], acc[q][1], acc[q][2], acc[q][3]);
          out[1] = make_float4(acc[q][4], acc[q][5], acc[q][6], acc[q][7]);
        }
      }
    }
    item = __shfl_sync(kFullMask, ahead, 0);
  }
}

template <typename T, FfnKind kKind>
__global__ void __launch_bounds__(kHeavyThreads, Cfg::kHeavyCtasPerSm) weight_grads_heavy_kernel(Params p) {
  chain_entry();
  constexpr int kGrads = grads_of<kKind>();
  __shared__ float partial[Cfg::kHeavyWarps][kGrads][kQuarter];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int group = lane / kGroupLanes, sub = lane % kGroupLanes;
  const int run = warp * Cfg::kHeavyGroups + group;
  const auto* x = static_cast<const T*>(p.x);
  const auto* dy = static_cast<const T*>(p.dy);
  const int64_t heavy_count = p.heavy[0];
  const int64_t items = (p.k + kQuarter - 1) / kQuarter * heavy_count;
  const EntryRecord none{0, 0.0f, 0.0f, 0.0f};  // past a run's end: row 0, zero coefficients
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t quarter = item / heavy_count;
    const int64_t neuron = p.heavy[2 + (item - quarter * heavy_count)];
    const int64_t col = quarter * kQuarter + sub * kVecElems;
    const bool in_k = col < p.k;
    const int64_t begin = p.col_ptr[neuron], count = p.col_ptr[neuron + 1] - begin;
    const int64_t per_run = (count + kRuns - 1) / kRuns;
    const int64_t lo = begin + min(count, per_run * run), hi = begin + min(count, per_run * (run + 1));
    float acc[3][kVecElems];
#pragma unroll
    for (int q = 0; q < 3; ++q)
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) acc[q][e] = 0.0f;
    // Lane `sub` of a group holds record lo + t0 + sub of its run; the next 8 are loaded while
    // these are consumed. t0 runs over per_run for every group, so the shuffles stay warp-uniform.
    EntryRecord mine = lo + sub < hi ? p.records[lo + sub] : none;
    for (int64_t t0 = 0; t0 < per_run; t0 += kGroupLanes) {
      const int64_t j_next = lo + t0 + kGroupLanes + sub;
      const EntryRecord next = j_next < hi ? p.records[j_next] : none;
#pragma unroll
      for (int b0 = 0; b0 < kGroupLanes; b0 += Cfg::kHeavyBatch) {
        uint4 xv[Cfg::kHeavyBatch], dyv[Cfg::kHeavyBatch];
#pragma unroll
        for (int b = 0; b < Cfg::kHeavyBatch; ++b) {
          const int64_t offset =
              int64_t(__shfl_sync(kFullMask, mine.row, b0 + b, kGroupLanes)) * p.k + col;
          xv[b] = dyv[b] = make_uint4(0, 0, 0, 0);
          if (in_k && lo + t0 + b0 + b < hi) {
            xv[b] = load_readonly(x + offset);
            dyv[b] = load_readonly(dy + offset);
          }
        }
#pragma unroll
        for (int b = 0; b < Cfg::kHeavyBatch; ++b)
          accumulate<T, kGrads>(acc, xv[b], dyv[b], __shfl_sync(kFullMask, mine.first, b0 + b, kGroupLanes),
                                __shfl_sync(kFullMask, mine.down, b0 + b, kGroupLanes),
                                __shfl_sync(kFullMask, mine.up, b0 + b, kGroupLanes));
      }
      mine = next;
    }
    // The warp's four runs: (g0 + g1) + (g2 + g3) in every lane of a column (a + b == b + a).
#pragma unroll
    for (int q = 0; q < kGrads; ++q)
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) {
        acc[q][e] += __shfl_xor_sync(kFullMask, acc[q][e], kGroupLanes);
        acc[q][e] += __shfl_xor_sync(kFullMask, acc[q][e], 2 * kGroupLanes);
      }
    if (group == 0) {
#pragma unroll
      for (int q = 0; q < kGrads; ++q)
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) partial[warp][q][sub * kVecElems + e] = acc[q][e];
    }
    __syncthreads();
    const int64_t c = quarter * kQuarter + threadIdx.x;
    if (threadIdx.x < kQuarter && c < p.k) {
#pragma unroll
      for (int q = 0; q < kGrads; ++q) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < Cfg::kHeavyWarps; ++w) sum += partial[w][q][threadIdx.x];
        p.outs[q][neuron * p.k + c] = sum;
      }
    }
    __syncthreads();  // partial is rewritten by the next item
  }
}

}  // namespace

int64_t weight_grad_passes(int64_t rows) {
  return std::max<int64_t>(1, (rows + Cfg::kChunkRows - 1) / Cfg::kChunkRows);
}

void launch_weight_grads(const WeightGradArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const char* op = "TrainingPlan::backward";
  if (a.k == 0 || a.n == 0) return;
  const int64_t passes = weight_grad_passes(a.rows);
  const int64_t blocks = column_index_blocks(a.rows);
  constexpr int64_t kBlocksPerPass = Cfg::kChunkRows / ColumnIndexConfig::kRowsPerBlock;
  Params p{a.x,
           a.dy,
           a.n,
           a.k,
           a.col_ptr,
           a.heavy,
           a.records,
           a.block_offsets,
           blocks,
           0,
           0,
           a.queue,
           {a.dfirst, a.ddown, a.dup}};
  check_cuda(cudaMemsetAsync(a.queue, 0, size_t(passes) * sizeof(int32_t), s), op, "weight gradient queues");
  const unsigned heavy_ctas = unsigned(std::max(1, dev.sm_count) * Cfg::kHeavyCtasPerSm);
  const unsigned warp_ctas = unsigned(std::max(1, dev.sm_count) * Cfg::kCtasPerSm);
  with_element_type(a.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    const bool gated = a.kind == FfnKind::gated;
    launch(
        gated ? weight_grads_heavy_kernel<T, FfnKind::gated> : weight_grads_heavy_kernel<T, FfnKind::plain>,
        dim3(heavy_ctas), dim3(kHeavyThreads), 0, s, p);
    for (int64_t pass = 0; pass < passes; ++pass) {
      p.first_block = pass * kBlocksPerPass;
      p.end_block = std::min(blocks, p.first_block + kBlocksPerPass);
      p.queue = a.queue + pass;
      launch(
          gated ? weight_grads_warp_kernel<T, FfnKind::gated> : weight_grads_warp_kernel<T, FfnKind::plain>,
          dim3(warp_ctas), dim3(kThreads), 0, s, p);
    }
  });
  check_launch(op, "weight gradient kernels");
}

}  // namespace twell::gpu
