// The problem a CUDA plan runs (the layer's shape, dtype and TwELL geometry) and the shapes the
// backend supports (ShapeLimits, config.hpp).
#pragma once
#include <cstdint>

#include "twell/dtype.hpp"
#include "twell/ffn.hpp"

namespace twell::gpu {

struct ProblemDims {
  FfnKind kind = FfnKind::gated;
  DType dtype = DType::bf16;
  int64_t k = 0;          // hidden
  int64_t n = 0;          // intermediate
  int32_t tile = 256;     // TwELL tile width
  int32_t capacity = 32;  // TwELL slots per (row, tile)
  int64_t num_tiles() const { return (n + tile - 1) / tile; }
};

// The problem, or Error (for op) naming the first property the CUDA kernels do not support.
ProblemDims supported_dims(const FfnWeights& w, int32_t tile, int32_t capacity, const char* op);

// Error (for op, naming x) unless a run of `rows` rows fits ShapeLimits::kMaxRows.
void check_rows(int64_t rows, const char* op);

}  // namespace twell::gpu
