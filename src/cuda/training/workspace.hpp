// The CUDA training workspace: where each part of a forward or a backward of M rows lives. A plan
// never runs the two at once (runs are ordered on its completion event), so both layouts start at
// offset 0 of the same plan-owned buffer. Offsets are from the aligned base (aligned_base()).
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/inference/workspace.hpp"
#include "cuda/policy/config.hpp"

namespace twell::gpu {

struct TrainForwardLayout {
  size_t active = 0;    // unsigned long long: non-zero gate activations (L0)
  size_t split_counters = 0;  // int32 [kMaxSplitTiles]: the routed GEMMs' split-K counters, right
                              // after `active`: one memset of train_forward_zeroed_bytes() zeroes both
  size_t split_partials = 0;  // the routed GEMMs' split-K partial tiles
  size_t lt = 0;        // cuBLASLt scratch
  size_t hidden = 0;    // G [M, N]; the routed-row backup turns routed rows into h
  size_t row_l1 = 0;    // f32 [max(M, kMaxPartials)]: sum |h| per row (dense form: per CTA)
  size_t control = 0;   // int32 [kRowQueueWords]: the row pass's queues (kernels/training.hpp)
  size_t long_rows = 0; // int32 [M]: the row pass's long rows
  size_t routed_blas = 0;  // [blas_rows, K + N]: the routed rows cuBLAS takes (launch_routed_blas)
  int64_t blas_rows = 0;
  size_t bytes = 0;     // 0 when M = 0
};
TrainForwardLayout train_forward_layout(const ProblemDims& d, int64_t rows);
// The bytes at TrainForwardLayout::active that a forward zeroes first: the count and the counters.
constexpr size_t train_forward_zeroed_bytes() {
  return sizeof(unsigned long long) + RoutedGemmConfig::kMaxSplitTiles * sizeof(int32_t);
}

struct TrainBackwardLayout {
  size_t block_counts = 0;  // int32 [column_index_blocks(M), N]
  size_t col_totals = 0;    // int32 [N]
  size_t col_ptr = 0;       // int64 [N + 1]
  size_t heavy = 0;         // int32 [N + 2]: the weight gradients' heavy neurons
  size_t queue = 0;         // int32 [weight_grad_passes(M)]: the weight gradients' item queues
  size_t control = 0;       // int32 [kRowQueueWords]: the row pass's queues (kernels/training.hpp)
  size_t long_rows = 0;     // int32 [M]: the row pass's long rows
  size_t split_counters = 0;  // int32 [kMaxSplitTiles]: the routed GEMMs' split-K counters
  // Two regions, each holding one thing until the weight gradients and another in the routed pass:
  size_t records = 0;       // EntryRecord [M * slots_per_row]: entries by neuron; then
  size_t p = 0;             //   dtype [chunk_rows, N]: routed rows' g, then h
  size_t q = 0;             //   dtype [chunk_rows, 2N] gated ([u | dh], then [dg | du]); [chunk_rows, N] plain
  int64_t chunk_rows = 0;   //   routed rows per chunk (routed_chunk_rows)
  size_t position = 0;      // int32 [M * slots_per_row]: each entry's place in its neuron's records; then
  size_t split_partials = 0;  // the routed GEMMs' split-K partial tiles, and
  size_t lt = 0;            //   cuBLAS(Lt) scratch: the same bytes
  size_t routed_blas = 0;   //   the routed rows cuBLAS takes: x and dy rows [blas_rows, K] (dtype),
  int64_t blas_rows = 0;    //   their dx rows [blas_rows, K] (f32)
  size_t bytes = 0;         // 0 when M = 0
};
TrainBackwardLayout train_backward_layout(const ProblemDims& d, int64_t rows);
// Routed rows per chunk of backward's routed pass (RoutedChunkConfig): M when their dense rows for
// all M rows take at most RoutedChunkConfig::kMinBytes; else M split into as many equal chunks as
// the column index's records take those rows in (rounded to nearest: 6 for a gated FFN at the
// default capacity, 4 plain), each rounded up to RoutedChunkConfig::kRowMultiple rows.
int64_t routed_chunk_rows(const ProblemDims& d, int64_t rows);

// The dense path's backward (the dense saved form).
struct TrainDenseBackwardLayout {
  size_t lt = 0;        // cuBLASLt / cuBLAS scratch
  size_t dh = 0;        // dtype [M, N]: dy Wd^T, then (gated) h = g u over it, element by element
  size_t q = 0;         // dtype [M, 2N] gated ([dg | du]); [M, N] plain (dg)
  size_t stacked = 0;   // dtype [2N, K]: a copy of [Wg; Wu] (gated, where the layout has one)
  size_t bytes = 0;     // 0 when M = 0
};
// copy_weights: room for the [Wg; Wu] copy (gated weights that do not lie one after the other).
TrainDenseBackwardLayout train_dense_backward_layout(const ProblemDims& d, int64_t rows, bool copy_weights);

}  // namespace twell::gpu
