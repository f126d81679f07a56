// The CUDA inference workspace: what one run of M rows needs and where each part lives.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/policy/problem.hpp"
#include "twell/ffn.hpp"

namespace twell::gpu {

// The paths a run may take; the workspace is sized for all of them (one run takes one).
enum class Paths : uint8_t { sparse, dense, either };
Paths paths_for(Dispatch d);

// Byte offsets from the workspace base rounded up to kAlign; `bytes` includes that slack.
struct WorkspaceLayout {
  static constexpr size_t kAlign = 256;
  size_t control = 0;      // RunCounters
  size_t ready = 0;        // the overlapped gate's row-block counters [gate_ready_blocks] int32;
                           // right after control: one memset zeroes both (control_bytes)
  size_t decode_arrivals = 0;  // decode path: axpys arrivals [M, slices] int32, zeroed with control
  size_t control_bytes = 0;
  size_t lt = 0;           // cuBLASLt scratch
  size_t hidden = 0;       // G [M, N]; becomes h for dense gated rows and routed gated rows
  size_t up = 0;           // dense gated: U [M, N]; shares its bytes with the TwELL arrays
  size_t values = 0;       // TwELL values [M, tiles, capacity]
  size_t cols = 0;         // TwELL cols [M, tiles, capacity] uint16
  size_t counts = 0;       // TwELL counts [M, tiles] uint16
  size_t row_slot = 0;     // TwELL row_slot [M] int32
  size_t routed_rows = 0;  // TwELL routed_rows [M] int32
  size_t heavy_rows = 0;   // routed rows sent to the tensor-core backup [M] int32
  size_t long_rows = 0;    // compact rows sent to the long-row kernel [M] int32
  size_t split_partials = 0;  // the routed GEMMs' split-K partial tiles (their counters: RunCounters)
  size_t routed_blas = 0;  // [blas_rows, K + N]: the routed rows cuBLAS takes (routed_blas.cu)
  int64_t blas_rows = 0;   // at most this many (RoutedBlasConfig)
  // The decode path (M <= DecodeConfig::kMaxRows; over the TwELL arrays' bytes, which it never uses):
  size_t decode_counts = 0;    // [M, chunks] int32
  size_t decode_neurons = 0;   // [M, chunks, kChunk] int32
  size_t decode_h = 0;         // [M, chunks, kChunk] f32 (the fused kernel's h: [M, N])
  size_t decode_partials = 0;  // [kMaxSplitRows, K] f32
  size_t decode_bitmap = 0;    // fused decode path: [M, FusedDecodeConfig::kMaxTokenWords] uint32
  size_t bytes = 0;        // 0 when M = 0 (a run of no rows touches nothing)
};
WorkspaceLayout workspace_layout(const ProblemDims& d, int64_t rows, Paths paths);

// The workspace pointer rounded up to WorkspaceLayout::kAlign.
char* aligned_base(void* workspace);

}  // namespace twell::gpu
