// Training backward over the compact (non-routed) rows of the saved layout: the hidden gradient at
// each active entry (its weight-gradient record) and dx.
//   dh = <dy[m], Wd[n]> + l1 * sign(h) / M;  gated: dg = dh * u, du = dh * g;  plain: dg = dh
//   dx[m] = sum dg W1[n] + du Wu[n] (fp32, rounded once)
// Two kernels when K is a multiple of 256 up to 2048 (train_rows.cuh), else the CTA kernel alone,
// split as in forward_rows.cu:
//   warp kernel: a warp per row from a queue, dy[m] and the fp32 accumulators of dx[m] in
//     registers; entries consumed two at a time (two down-dots, then W1 and Wu rows axpy'd); rows
//     over TrainRowConfig::kLongRow entries listed for the CTA kernel. Run split in two kernels
//     (warp_rows::Phase): the dots phase stores the entries' records, the axpys phase reads their
//     coefficients dh u and dh g back (each lane its own entry's record, one load per group).
//   CTA kernel: one row per CTA (grid = M, or grid-stride over the long-row list); each batch of
//     kBatch down-dots is reduced across warps in shared memory.
// Where a kernel computes an entry's dh it stores the entry's weight-gradient record where the
// column index placed its slot: records[col_ptr[n] + position[slot]] (launch_column_index runs first).
// A routed row is skipped by both (the dense routed-row path writes it). Where a loaded dy row holds
// a NaN or Inf, the kernels raise control[kNonFiniteDyWord] for launch_nonfinite_dy.
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
__device__ void backward_row(const T* __restrict__ dy, const T* __restrict__ first, const T* __restrict__ up,
                             const T* __restrict__ down, T* __restrict__ dx, const int64_t* __restrict__ col_ptr,
                             const int32_t* __restrict__ position, EntryRecord* __restrict__ records,
                             const L1Coef& l1, int64_t k, const TwellView& tw, int64_t row,
                             rows::RowCounts& counts, rows::BatchPartials& partial, int32_t* nonfinite_dy) {
  const int num_tiles = tiles_of(tw.shape);
  rows::stage_counts(counts, tw, row, num_tiles);

  const int64_t vectors = k / kVecElems;
  const auto* values = static_cast<const T*>(tw.values);
  const T* plane1 = values + plane_elements(tw.shape);
  const float scale = l1_scale(l1, tw.shape.rows);
  float dyr[kVecs][kVecElems];
  float acc[kVecs][kVecElems];
  rows::load_row<T, kVecs>(dy + row * k, vectors, dyr);
  bool nonfinite = false;
#pragma unroll
  for (int j = 0; j < kVecs; ++j)
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) {
      nonfinite |= !isfinite(dyr[j][e]);
      acc[j][e] = 0.0f;
    }
  if (__syncthreads_or(nonfinite) && threadIdx.x == 0) atomicOr(nonfinite_dy, 1);

  int buffer = 0;
  rows::for_each_batch(counts, num_tiles, tw, row, [&](const int (&neuron)[kBatch], const int64_t (&slot)[kBatch],
                                                   int taken) {
    float dot[kBatch];
    rows::batch_dots<T, kVecs>(dyr, down, neuron, taken, k, partial, buffer, dot);

#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (b >= taken) continue;
      const float g = Elem<T>::to_float(values[slot[b]]);
      const float u = kKind == FfnKind::gated ? Elem<T>::to_float(plane1[slot[b]]) : 1.0f;
      const float dh = dot[b] + scale * sign_of(g * u);
      if (threadIdx.x == 0) records[col_ptr[neuron[b]] + position[slot[b]]] = entry_record(row, dh, g, u);
      rows::axpy_row<T, kVecs>(dh * u, first + int64_t(neuron[b]) * k, vectors, acc);
      if constexpr (kKind == FfnKind::gated)
        rows::axpy_row<T, kVecs>(dh * g, up + int64_t(neuron[b]) * k, vectors, acc);
    }
  });

  rows::store_row<T, kVecs>(dx + row * k, vectors, acc);
}

template <typename T, FfnKind kKind, int kVecs>
__global__ void __launch_bounds__(CtaRowConfig::kMaxThreads)
    backward_rows_kernel(const T* __restrict__ dy, const T* __restrict__ first, const T* __restrict__ up,
                         const T* __restrict__ down, T* __restrict__ dx, const int64_t* __restrict__ col_ptr,
                         const int32_t* __restrict__ position, EntryRecord* __restrict__ records, L1Coef l1,
                         int64_t k, TwellView tw, int32_t* nonfinite_dy) {
  chain_entry();
  __shared__ rows::BatchPartials partial;
  __shared__ rows::RowCounts counts;
  const int64_t row = blockIdx.x;
  if (tw.row_slot[row] < 0)
    backward_row<T, kKind, kVecs>(dy, first, up, down, dx, col_ptr, position, records, l1, k, tw, row, counts,
                                  partial, nonfinite_dy);
}

struct WarpArgs {
  const void* dy;
  const void* first;
  const void* up;
  const void* down;
  void* dx;
  const int64_t* col_ptr;
  const int32_t* position;
  EntryRecord* records;
  L1Coef l1;
  TwellView tw;
  int32_t* control;
  int32_t* long_rows;
  int32_t* nonfinite_dy;
};

// The pass: its rows for rows::warp_row_kernel / long_row_kernel (extra: unused) on the device,
// its launches for rows::run_pass on the host.
struct BackwardPass : rows::TrainWarpPass<BackwardPass, WarpArgs> {
  // One warp's part of a compact row: the entry groups first_group, first_group + group_step, ...
  // (their records stored, or read back by the axpys phase), accumulated into acc.
  template <typename T, FfnKind kKind, int kChunks, warp_rows::Phase kPhase>
  static __device__ void part(const Args& a, int64_t row, int lane, int first_group, int group_step,
                              float (&acc)[kChunks][kVecElems], float& /*extra*/) {
    using warp_rows::Phase;
    constexpr int64_t k = int64_t(kChunks) * RowConfig::kChunk;
    const auto* first = static_cast<const T*>(a.first);
    const auto* up = static_cast<const T*>(a.up);
    const auto* down = static_cast<const T*>(a.down);
    const auto* values = static_cast<const T*>(a.tw.values);
    const T* plane1 = values + plane_elements(a.tw.shape);
    const float scale = l1_scale(a.l1, a.tw.shape.rows);
    uint4 dyr[kChunks];
    if constexpr (kPhase != Phase::axpys) {
      warp_rows::load_row<T, kChunks>(static_cast<const T*>(a.dy) + row * k, lane, dyr);
      bool nonfinite = false;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) nonfinite |= any_nonfinite<T>(dyr[c]);
      if (__any_sync(kFullMask, nonfinite) && lane == 0) atomicOr(a.nonfinite_dy, 1);
    }
    warp_rows::zero(acc);
    int group = 0;
    warp_rows::for_each_entry_group(a.tw, row, lane, [&](int neuron, int64_t slot, int count) {
      if (group++ % group_step != first_group) return;
      // This lane's entry: g and u (the dots and fused phases), or its record's dh u and dh g (axpys).
      float g = 0.0f, u = 1.0f, dhu = 0.0f, dhg = 0.0f;
      int64_t place = 0;  // its record
      if (slot >= 0) {
        place = a.col_ptr[neuron] + a.position[slot];
        if constexpr (kPhase == Phase::axpys) {
          const EntryRecord r = a.records[place];
          dhu = r.first;
          dhg = r.up;
        } else {
          g = Elem<T>::to_float(values[slot]);
          if constexpr (kKind == FfnKind::gated) u = Elem<T>::to_float(plane1[slot]);
        }
      }
      warp_rows::for_each_pair(neuron, slot, count, [&](const warp_rows::EntryPair& e) {
        float first0, first1, up0, up1;  // the axpys' coefficients: dh u and dh g (entry_record's)
        if constexpr (kPhase == Phase::axpys) {
          first0 = e.first(dhu);
          up0 = e.first(dhg);
          first1 = e.two ? e.second(dhu) : 0.0f;
          up1 = e.two ? e.second(dhg) : 0.0f;
        } else {
          const float g0 = e.first(g), g1 = e.second(g);
          const float u0 = e.first(u), u1 = e.second(u);
          float d0, d1;
          warp_rows::dot2<T, kChunks>(dyr, down + int64_t(e.n0) * k, down + int64_t(e.n1) * k, lane, d0, d1);
          const float dh0 = d0 + scale * sign_of(g0 * u0);
          const float dh1 = e.two ? d1 + scale * sign_of(g1 * u1) : 0.0f;
          const int64_t p0 = e.first(place), p1 = e.second(place);
          const EntryRecord r0 = entry_record(row, dh0, g0, u0), r1 = entry_record(row, dh1, g1, u1);
          if (lane == 0) {
            a.records[p0] = r0;
            if (e.two) a.records[p1] = r1;
          }
          first0 = r0.first;
          up0 = r0.up;
          first1 = r1.first;
          up1 = r1.up;
        }
        if constexpr (kPhase == Phase::dots) return;
        warp_rows::axpy2<T, kChunks>(acc, first0, first + int64_t(e.n0) * k, first1, first + int64_t(e.n1) * k, lane);
        if constexpr (kKind == FfnKind::gated)
          warp_rows::axpy2<T, kChunks>(acc, up0, up + int64_t(e.n0) * k, up1, up + int64_t(e.n1) * k, lane);
      });
    });
  }
  static __device__ void* out(const Args& a) { return a.dx; }
  static __device__ float* row_extra(const Args&) { return nullptr; }

  const BackwardRowsArgs& a;

  template <typename T, FfnKind kKind, int kChunks>
  void warp(const rows::PassGrid& grid, cudaStream_t s) const {
    using warp_rows::Phase;
    const WarpArgs w{a.dy,      a.first,   a.up,        a.down, a.dx, a.col_ptr, a.position, a.records, a.l1,
                     a.saved,   a.control, a.long_rows, a.control + kNonFiniteDyWord};
    rows::launch_warp_pass<BackwardPass, T, kKind, kChunks, Phase::dots, Phase::axpys>(grid, s, w);
  }

  template <typename T, FfnKind kKind, int kVecs>
  void cta(int64_t rows, int threads, cudaStream_t s) const {
    check_cuda(cudaMemsetAsync(a.control + kNonFiniteDyWord, 0, sizeof(int32_t), s), "TrainingPlan::backward",
               "non-finite dy flag");
    launch(backward_rows_kernel<T, kKind, kVecs>, dim3(unsigned(rows)), dim3(unsigned(threads)), 0, s,
           static_cast<const T*>(a.dy), static_cast<const T*>(a.first), static_cast<const T*>(a.up),
           static_cast<const T*>(a.down), static_cast<T*>(a.dx), a.col_ptr, a.position, a.records, a.l1, a.k,
           a.saved, a.control + kNonFiniteDyWord);
  }
};

}  // namespace

void launch_backward_rows(const BackwardRowsArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  rows::run_pass(BackwardPass{{}, a}, a.saved, a.kind, a.k, a.control, dev, s, "TrainingPlan::backward");
}

}  // namespace twell::gpu
