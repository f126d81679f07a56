#include "cuda/training/workspace.hpp"

#include <algorithm>

#include "cuda/kernels/training.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/policy/train_config.hpp"

namespace twell::gpu {

namespace {

// Hands out aligned offsets in order.
class Carver {
 public:
  static size_t aligned(size_t bytes) {
    return (bytes + WorkspaceLayout::kAlign - 1) / WorkspaceLayout::kAlign * WorkspaceLayout::kAlign;
  }
  size_t take(size_t bytes) {
    const size_t offset = at_;
    at_ += aligned(bytes);
    return offset;
  }
  // The total, with slack for aligning the buffer's base.
  size_t bytes() const { return at_ + WorkspaceLayout::kAlign; }

 private:
  size_t at_ = 0;
};

}  // namespace

TrainForwardLayout train_forward_layout(const ProblemDims& d, int64_t rows) {
  TrainForwardLayout l;
  if (rows == 0) return l;
  const size_t m = size_t(rows);
  Carver c;
  l.active = c.take(train_forward_zeroed_bytes());
  l.split_counters = l.active + sizeof(unsigned long long);
  l.lt = c.take(LtConfig::kWorkspaceBytes);
  l.hidden = c.take(m * size_t(d.n) * dtype_size(d.dtype));
  // row_l1 also holds the dense form's per-CTA L1 sums (launch_dense_hidden).
  l.row_l1 = c.take(std::max<size_t>(m, ElementwiseConfig::kMaxPartials) * sizeof(float));
  l.control = c.take(kRowQueueWords * sizeof(int32_t));
  l.long_rows = c.take(m * sizeof(int32_t));
  l.split_partials = c.take(RoutedGemmConfig::kSplitPartialBytes);
  l.blas_rows = routed_blas_rows(rows, routed_blas_row_bytes(d));
  l.routed_blas = c.take(size_t(l.blas_rows) * routed_blas_row_bytes(d));
  l.bytes = c.bytes();
  return l;
}

namespace {

size_t routed_row_bytes(const ProblemDims& d) {
  return size_t(d.n) * dtype_size(d.dtype) * (d.kind == FfnKind::gated ? 3 : 2);
}

size_t entry_slots(const ProblemDims& d, int64_t rows) {
  return size_t(rows) * size_t(d.num_tiles()) * size_t(d.capacity);
}

}  // namespace

int64_t routed_chunk_rows(const ProblemDims& d, int64_t rows) {
  const size_t row_bytes = routed_row_bytes(d);
  const size_t all_rows = size_t(rows) * row_bytes;
  if (all_rows <= RoutedChunkConfig::kMinBytes) return rows;
  constexpr int64_t kMul = RoutedChunkConfig::kRowMultiple;
  // As many equal chunks as the records' bytes take the rows' dense rows in (rounded to nearest,
  // at least one), each rounded up to kMul rows.
  const size_t record_bytes = std::max<size_t>(entry_slots(d, rows) * sizeof(EntryRecord), 1);
  const int64_t chunks = std::max<int64_t>(1, int64_t((all_rows + record_bytes / 2) / record_bytes));
  const int64_t per = (rows + chunks - 1) / chunks;
  return std::min(rows, (per + kMul - 1) / kMul * kMul);
}

TrainBackwardLayout train_backward_layout(const ProblemDims& d, int64_t rows) {
  TrainBackwardLayout l;
  if (rows == 0) return l;
  const size_t n = size_t(d.n);
  const size_t slots = entry_slots(d, rows);
  const size_t es = dtype_size(d.dtype);
  l.chunk_rows = routed_chunk_rows(d, rows);
  const size_t m = size_t(rows);
  const size_t chunk = size_t(l.chunk_rows);
  Carver c;
  l.block_counts = c.take(size_t(column_index_blocks(rows)) * n * sizeof(int32_t));
  l.col_totals = c.take(n * sizeof(int32_t));
  l.col_ptr = c.take((n + 1) * sizeof(int64_t));
  l.heavy = c.take((n + 2) * sizeof(int32_t));
  l.queue = c.take(size_t(weight_grad_passes(rows)) * sizeof(int32_t));
  l.control = c.take(kRowQueueWords * sizeof(int32_t));
  l.long_rows = c.take(m * sizeof(int32_t));
  l.split_counters = c.take(RoutedGemmConfig::kMaxSplitTiles * sizeof(int32_t));

  // Region A: the records (written by the backward rows, read by the weight gradients), then the
  // routed rows' p and q (the routed pass, which follows).
  const size_t p_bytes = Carver::aligned(chunk * n * es);
  const size_t q_bytes = chunk * n * es * (d.kind == FfnKind::gated ? 2 : 1);
  l.records = c.take(std::max(slots * sizeof(EntryRecord), p_bytes + q_bytes));
  l.p = l.records;
  l.q = l.p + p_bytes;

  // Region B: the positions (the column index to the backward rows), then the routed pass's
  // cuBLAS(Lt) scratch, which shares its bytes with the split-K partials (scratch of one launch
  // each on one stream), and the rows cuBLAS takes: x and dy rows (dtype) and their dx rows (f32),
  // as many as fill the positions' bytes (at least kBackwardMinBytes, at most kBytes).
  const size_t position_bytes = slots * sizeof(int32_t);
  const size_t scratch = Carver::aligned(std::max(RoutedGemmConfig::kSplitPartialBytes, LtConfig::kWorkspaceBytes));
  const size_t blas_row = size_t(d.k) * (2 * es + sizeof(float));
  const size_t blas_room = std::clamp(position_bytes > scratch ? position_bytes - scratch : 0,
                                      RoutedBlasConfig::kBackwardMinBytes, RoutedBlasConfig::kBytes);
  l.blas_rows = routed_blas_rows(rows, blas_row, blas_room);
  l.position = c.take(std::max(position_bytes, scratch + size_t(l.blas_rows) * blas_row));
  l.split_partials = l.position;
  l.lt = l.position;
  l.routed_blas = l.position + scratch;
  l.bytes = c.bytes();
  return l;
}

TrainDenseBackwardLayout train_dense_backward_layout(const ProblemDims& d, int64_t rows, bool copy_weights) {
  TrainDenseBackwardLayout l;
  if (rows == 0) return l;
  const bool gated = d.kind == FfnKind::gated;
  const size_t mn = size_t(rows) * size_t(d.n), es = dtype_size(d.dtype);
  Carver c;
  l.lt = c.take(LtConfig::kWorkspaceBytes);
  l.dh = c.take(mn * es);
  l.q = c.take(mn * es * (gated ? 2 : 1));
  l.stacked = c.take(gated && copy_weights ? 2 * size_t(d.n) * size_t(d.k) * es : 0);
  l.bytes = c.bytes();
  return l;
}

}  // namespace twell::gpu
