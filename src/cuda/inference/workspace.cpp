#include "cuda/inference/workspace.hpp"

#include <algorithm>
#include <iterator>
#include <string>

#include "cuda/kernels/inference.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

size_t round_up(size_t v) {
  return (v + WorkspaceLayout::kAlign - 1) / WorkspaceLayout::kAlign * WorkspaceLayout::kAlign;
}

}  // namespace

Paths paths_for(Dispatch d) {
  switch (d) {
    case Dispatch::force_sparse: return Paths::sparse;
    case Dispatch::force_dense: return Paths::dense;
    case Dispatch::automatic: return Paths::either;
  }
  return Paths::either;
}

WorkspaceLayout workspace_layout(const ProblemDims& d, int64_t rows, Paths paths) {
  WorkspaceLayout l;
  if (rows == 0) return l;
  const size_t m = size_t(rows);
  const size_t es = dtype_size(d.dtype);
  const size_t slots = m * size_t(d.num_tiles()) * size_t(d.capacity);
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t offset = at;
    at += round_up(bytes);
    return offset;
  };
  l.control = take(sizeof(RunCounters));
  l.ready = take(size_t(gate_ready_blocks(rows)) * sizeof(int32_t));
  const bool decode = paths != Paths::dense && rows <= DecodeConfig::kMaxRows;
  if (decode) l.decode_arrivals = take(m * size_t(DecodeConfig::slices(d.k)) * sizeof(int32_t));
  l.control_bytes = at - l.control;
  l.lt = take(LtConfig::kWorkspaceBytes);
  l.hidden = take(m * size_t(d.n) * es);
  const size_t shared = at;  // the dense U and the TwELL arrays overlay each other from here
  size_t end = at;
  if (paths != Paths::sparse && d.kind == FfnKind::gated) {
    l.up = take(m * size_t(d.n) * es);
    end = std::max(end, at);
  }
  if (decode) {
    at = shared;
    const size_t entries = m * size_t(DecodeConfig::chunks(d.n));
    l.decode_counts = take(entries * sizeof(int32_t));
    l.decode_neurons = take(entries * DecodeConfig::kChunk * sizeof(int32_t));
    l.decode_h = take(entries * DecodeConfig::kChunk * sizeof(float));
    l.decode_partials = take(size_t(DecodeConfig::kMaxSplitRows) * size_t(d.k) * sizeof(float));
    if (rows <= FusedDecodeConfig::kMaxRows)
      l.decode_bitmap = take(m * size_t(FusedDecodeConfig::kMaxTokenWords) * sizeof(uint32_t));
    end = std::max(end, at);
  } else if (paths != Paths::dense) {
    at = shared;
    l.values = take(slots * es);
    l.cols = take(slots * sizeof(uint16_t));
    l.counts = take(m * size_t(d.num_tiles()) * sizeof(uint16_t));
    l.row_slot = take(m * sizeof(int32_t));
    l.routed_rows = take(m * sizeof(int32_t));
    l.heavy_rows = take(m * sizeof(int32_t));
    l.long_rows = take(m * sizeof(int32_t));
    l.split_partials = take(RoutedGemmConfig::kSplitPartialBytes);
    l.blas_rows = routed_blas_rows(rows, routed_blas_row_bytes(d));
    l.routed_blas = take(size_t(l.blas_rows) * routed_blas_row_bytes(d));
    end = std::max(end, at);
  }
  l.bytes = end + WorkspaceLayout::kAlign;  // slack for aligning an arbitrary caller pointer
  return l;
}

char* aligned_base(void* workspace) {
  const auto u = reinterpret_cast<uintptr_t>(workspace);
  const uintptr_t a = WorkspaceLayout::kAlign;
  return static_cast<char*>(workspace) + ((a - u % a) % a);
}

}  // namespace twell::gpu
