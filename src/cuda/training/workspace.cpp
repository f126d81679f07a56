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
  size_t take(size_t bytes) {
    const size_t offset = at_;
    at_ += (bytes + WorkspaceLayout::kAlign - 1) / WorkspaceLayout::kAlign * WorkspaceLayout::kAlign;
    return offset;
  }
  // The end of what was taken so far.
  size_t end() const { return at_; }
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
  if (size_t(rows) * row_bytes <= RoutedChunkConfig::kMinBytes) return rows;
  constexpr int64_t kMul = RoutedChunkConfig::kRowMultiple;
  const size_t record_bytes = entry_slots(d, rows) * (sizeof(EntryRecord) + sizeof(int64_t));
  const int64_t fit = int64_t(record_bytes / row_bytes) / kMul * kMul;
  const int64_t half = ((rows + 1) / 2 + kMul - 1) / kMul * kMul;
  return std::min(rows, std::max(fit, half));
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
  l.dh = c.take(slots * sizeof(float));
  l.block_counts = c.take(size_t(column_index_blocks(rows)) * n * sizeof(int32_t));
  l.col_totals = c.take(n * sizeof(int32_t));
  l.col_ptr = c.take((n + 1) * sizeof(int64_t));
  l.heavy = c.take((n + 2) * sizeof(int32_t));
  l.queue = c.take(size_t(weight_grad_passes(rows)) * sizeof(int32_t));
  l.p = c.take(chunk * n * es);
  l.q = c.take(chunk * n * es * (d.kind == FfnKind::gated ? 2 : 1));
  // The records and their positions live in p and q (free until the routed rows' pass, which
  // follows the weight gradients) when they fit: with the default capacity (tile / 8) they take
  // 2 M N and M N bytes, which is what p and q take for the chunk routed_chunk_rows gives where
  // the rows are chunked (gated; plain: 0.75 M rows, 3 M N bytes).
  const size_t record_bytes = slots * sizeof(EntryRecord);
  const size_t position_bytes = slots * sizeof(int64_t);
  const size_t free_bytes = c.end() - l.p;
  const bool both_fit = record_bytes + position_bytes <= free_bytes;
  l.records = record_bytes <= free_bytes ? l.p : c.take(record_bytes);
  l.position = both_fit ? l.p + record_bytes : c.take(position_bytes);
  l.control = c.take(kRowQueueWords * sizeof(int32_t));
  l.long_rows = c.take(m * sizeof(int32_t));
  l.split_counters = c.take(RoutedGemmConfig::kMaxSplitTiles * sizeof(int32_t));
  // cuBLAS's scratch shares the split-K partials' bytes: both are scratch of one launch on the
  // same stream.
  l.split_partials = c.take(std::max(RoutedGemmConfig::kSplitPartialBytes, LtConfig::kWorkspaceBytes));
  l.lt = l.split_partials;
  const size_t blas_row = size_t(d.k) * (2 * es + sizeof(float));
  l.blas_rows = routed_blas_rows(rows, blas_row);
  l.routed_blas = c.take(size_t(l.blas_rows) * blas_row);
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
