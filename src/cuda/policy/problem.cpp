#include "cuda/policy/problem.hpp"

#include <algorithm>
#include <iterator>
#include <string>

#include "cuda/policy/config.hpp"
#include "twell/error.hpp"

namespace twell::gpu {

namespace {
bool fits(int64_t v, int64_t limit) { return v % ShapeLimits::kElemsPerVector == 0 && v <= limit; }
}  // namespace

ProblemDims supported_dims(const FfnWeights& w, int32_t tile, int32_t capacity, const char* op) {
  if (w.up.dtype != DType::bf16 && w.up.dtype != DType::f16)
    throw Error(op, "weights dtype", "float16 or bfloat16 (CUDA backend)",
                dtype_name(w.up.dtype));
  ProblemDims d;
  d.kind = w.kind;
  d.dtype = w.up.dtype;
  d.k = w.hidden();
  d.n = w.intermediate();
  d.tile = tile;
  d.capacity = capacity;
  if (!fits(d.k, ShapeLimits::kMaxHidden))
    throw Error(op, "hidden size K",
                "a multiple of 8 up to " + std::to_string(ShapeLimits::kMaxHidden) + " (CUDA backend)",
                std::to_string(d.k));
  if (!fits(d.n, ShapeLimits::kMaxIntermediate))
    throw Error(op, "intermediate size N",
                "a multiple of 8 up to " + std::to_string(ShapeLimits::kMaxIntermediate) +
                    " (CUDA backend)",
                std::to_string(d.n));
  if (std::find(std::begin(kTileWidths), std::end(kTileWidths), d.tile) == std::end(kTileWidths))
    throw Error(op, "options.tile", "64, 128 or 256 (CUDA backend)", std::to_string(d.tile));
  return d;
}

void check_rows(int64_t rows, const char* op) {
  if (rows > ShapeLimits::kMaxRows)
    throw Error(op, "x", "at most " + std::to_string(ShapeLimits::kMaxRows) + " rows (int32 row indices)",
                std::to_string(rows));
}

}  // namespace twell::gpu
