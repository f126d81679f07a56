// Training forward over the compact (non-routed) rows of the saved layout: the up projection at
// the active entries (saved as plane 1), y and the per-row L1 sum.
//   gated: u = <x[m], Wu[n]> rounded to the dtype -> plane 1;  h = g * u;   plain: h = g
//   y[m] = sum h Wd[n] (fp32, rounded once);  row_l1[m] = sum |h| (in entry order)
// Warp kernels when K is a multiple of 256 up to 2048 (train_rows.cuh on warp_rows.cuh; gated rows split into an up
// dots phase that stores u and an axpys phase that reads it, warp_rows::Phase), else the CTA kernel alone:
//   warp kernel: persistent grid; a warp takes the next row from a queue and holds x[m] and the
//     fp32 accumulators of y[m] in registers; entries are decoded 32 at a time (one per lane) and
//     consumed two at a time (two up-dots, one butterfly each, two Wd rows axpy'd). Rows with more
//     than TrainRowConfig::kLongRow entries are listed for the CTA kernel.
//   CTA kernel: one row per CTA (grid = M; or grid-stride over the long-row list): thread t holds
//     the 16-byte vectors v = t + j * blockDim of K; each batch of kBatch up-dots is reduced across
//     warps in shared memory.
// A routed row is skipped by both (the routed-row backup writes it).
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/rows/train_rows.cuh"
#include "cuda/kernels/rows/warp_rows.cuh"
#include "cuda/kernels/training.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

using rows::kBatch;

template <typename T, FfnKind kKind, int kVecs>
__device__ void forward_row(const T* __restrict__ x, const T* __restrict__ up, const T* __restrict__ down,
                            T* __restrict__ y, float* __restrict__ row_l1, int64_t k, const TwellView& tw,
                            int64_t row, rows::RowCounts& counts, rows::BatchPartials& partial) {
  const int num_tiles = tiles_of(tw.shape);
  rows::stage_counts(counts, tw, row, num_tiles);

  const int64_t vectors = k / kVecElems;
  auto* values = static_cast<T*>(tw.values);
  T* plane1 = values + plane_elements(tw.shape);
  float xr[kVecs][kVecElems];
  float acc[kVecs][kVecElems];
  if constexpr (kKind == FfnKind::gated) rows::load_row<T, kVecs>(x + row * k, vectors, xr);
  warp_rows::zero(acc);
  __syncthreads();

  int buffer = 0;
  float l1 = 0.0f;
  rows::for_each_batch(counts, num_tiles, tw, row, [&](const int (&neuron)[kBatch], const int64_t (&slot)[kBatch],
                                                   int taken) {
    float h[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) h[b] = b < taken ? Elem<T>::to_float(values[slot[b]]) : 0.0f;

    if constexpr (kKind == FfnKind::gated) {
      float dot[kBatch];
      rows::batch_dots<T, kVecs>(xr, up, neuron, taken, k, partial, buffer, dot);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (b >= taken) continue;
        const T u = Elem<T>::from_float(dot[b]);
        if (threadIdx.x == 0) plane1[slot[b]] = u;
        h[b] *= Elem<T>::to_float(u);
      }
    }

#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (b >= taken) continue;
      l1 += fabsf(h[b]);
      rows::axpy_row<T, kVecs>(h[b], down + int64_t(neuron[b]) * k, vectors, acc);
    }
  });

  rows::store_row<T, kVecs>(y + row * k, vectors, acc);
  if (row_l1 != nullptr && threadIdx.x == 0) row_l1[row] = l1;
}

template <typename T, FfnKind kKind, int kVecs>
__global__ void __launch_bounds__(CtaRowConfig::kMaxThreads)
    forward_rows_kernel(const T* __restrict__ x, const T* __restrict__ up,
                        const T* __restrict__ down, T* __restrict__ y, float* __restrict__ row_l1,
                        int64_t k, TwellView tw) {
  chain_entry();
  __shared__ rows::BatchPartials partial;
  __shared__ rows::RowCounts counts;
  const int64_t row = blockIdx.x;
  if (tw.row_slot[row] < 0) forward_row<T, kKind, kVecs>(x, up, down, y, row_l1, k, tw, row, counts, partial);
}

struct WarpArgs {
  const void* x;
  const void* up;
  const void* down;
  void* y;
  float* row_l1;
  TwellView tw;
  int32_t* control;
  int32_t* long_rows;
};

// The pass: its rows for rows::warp_row_kernel / long_row_kernel (extra: the row's L1) on the device,
// its launches for rows::run_pass on the host.
struct ForwardPass : rows::TrainWarpPass<ForwardPass, WarpArgs> {
  // One warp's part of a compact row: the entry groups first_group, first_group + group_step, ...
  // (u stored at their slots), accumulated into acc and l1 (|h| in entry order).
  template <typename T, FfnKind kKind, int kChunks, warp_rows::Phase kPhase>
  static __device__ void part(const Args& a, int64_t row, int lane, int first_group, int group_step,
                              float (&acc)[kChunks][kVecElems], float& l1) {
    using warp_rows::Phase;
    constexpr int64_t k = int64_t(kChunks) * RowConfig::kChunk;
    const auto* up = static_cast<const T*>(a.up);
    const auto* down = static_cast<const T*>(a.down);
    auto* values = static_cast<T*>(a.tw.values);
    T* plane1 = values + plane_elements(a.tw.shape);
    uint4 xr[kChunks];
    if constexpr (kKind == FfnKind::gated && kPhase != Phase::axpys)
      warp_rows::load_row<T, kChunks>(static_cast<const T*>(a.x) + row * k, lane, xr);
    warp_rows::zero(acc);
    l1 = 0.0f;
    int group = 0;
    warp_rows::for_each_entry_group(a.tw, row, lane, [&](int neuron, int64_t slot, int count) {
      if (group++ % group_step != first_group) return;
      const float g = slot >= 0 ? Elem<T>::to_float(values[slot]) : 0.0f;
      warp_rows::for_each_pair(neuron, slot, count, [&](const warp_rows::EntryPair& e) {
        float h0 = e.first(g);
        float h1 = e.two ? e.second(g) : 0.0f;
        if constexpr (kPhase == Phase::axpys) {  // gated: u from the dots phase
          h0 *= Elem<T>::to_float(plane1[e.s0]);
          h1 *= e.two ? Elem<T>::to_float(plane1[e.s1]) : 0.0f;
        } else if constexpr (kKind == FfnKind::gated) {
          float d0, d1;
          warp_rows::dot2<T, kChunks>(xr, up + int64_t(e.n0) * k, up + int64_t(e.n1) * k, lane, d0, d1);
          const T u0 = Elem<T>::from_float(d0), u1 = Elem<T>::from_float(d1);
          if (lane == 0) {
            plane1[e.s0] = u0;
            if (e.two) plane1[e.s1] = u1;
          }
          h0 *= Elem<T>::to_float(u0);
          h1 *= Elem<T>::to_float(u1);
        }
        if constexpr (kPhase != Phase::dots) {
          l1 += fabsf(h0);
          if (e.two) l1 += fabsf(h1);
          warp_rows::axpy2<T, kChunks>(acc, h0, down + int64_t(e.n0) * k, h1, down + int64_t(e.n1) * k, lane);
        }
      });
    });
  }
  static __device__ void* out(const Args& a) { return a.y; }
  static __device__ float* row_extra(const Args& a) { return a.row_l1; }

  const ForwardRowsArgs& a;

  template <typename T, FfnKind kKind, int kChunks>
  void warp(const rows::PassGrid& grid, cudaStream_t s) const {
    using warp_rows::Phase;
    const CompactArgs& c = a.compact;
    const WarpArgs w{c.x, c.up, c.down, c.y, a.row_l1, c.twell, a.control, a.long_rows};
    if constexpr (kKind == FfnKind::gated)
      rows::launch_warp_pass<ForwardPass, T, kKind, kChunks, Phase::dots, Phase::axpys>(grid, s, w);
    else
      rows::launch_warp_pass<ForwardPass, T, kKind, kChunks, Phase::fused>(grid, s, w);
  }

  template <typename T, FfnKind kKind, int kVecs>
  void cta(int64_t rows, int threads, cudaStream_t s) const {
    const CompactArgs& c = a.compact;
    launch(forward_rows_kernel<T, kKind, kVecs>, dim3(unsigned(rows)), dim3(unsigned(threads)), 0, s,
           static_cast<const T*>(c.x), static_cast<const T*>(c.up), static_cast<const T*>(c.down),
           static_cast<T*>(c.y), a.row_l1, c.hidden, c.twell);
  }
};

}  // namespace

void launch_forward_rows(const ForwardRowsArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const CompactArgs& c = a.compact;
  rows::run_pass(ForwardPass{{}, a}, c.twell, c.kind, c.hidden, a.control, dev, s, "TrainingPlan::forward");
}

}  // namespace twell::gpu
