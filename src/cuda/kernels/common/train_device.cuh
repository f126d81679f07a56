// Device helpers shared by the training kernels: TwELL geometry and the L1 term.
#pragma once
#include <cstdint>

#include "cuda/kernels/training.hpp"
#include "twell/format.hpp"

namespace twell::gpu {

__device__ __forceinline__ int tiles_of(const TwellShape& s) { return int((s.cols + s.tile - 1) / s.tile); }

// Elements of one value plane: rows x tiles x capacity.
__device__ __forceinline__ int64_t plane_elements(const TwellShape& s) {
  return s.rows * tiles_of(s) * s.capacity;
}

// Columns of tile t (the last tile may be narrower).
__device__ __forceinline__ int tile_width(const TwellShape& s, int t) {
  const int64_t rest = s.cols - int64_t(t) * s.tile;
  return int(rest < s.tile ? rest : s.tile);
}

// sign(v) as -1, 0 or +1.
__device__ __forceinline__ float sign_of(float v) { return float((v > 0.0f) - (v < 0.0f)); }

// A compact entry's weight-gradient record (EntryRecord; plain layers pass u = 1).
__device__ __forceinline__ EntryRecord entry_record(int64_t row, float dh, float g, float u) {
  return EntryRecord{int32_t(row), dh * u, dh * g, g * u};
}

// The L1 term's gradient scale, coefficient / rows (the coefficient read on the device if given).
__device__ __forceinline__ float l1_scale(const L1Coef& l1, int64_t rows) {
  return (l1.device != nullptr ? *l1.device : l1.host) / float(rows);
}

}  // namespace twell::gpu
