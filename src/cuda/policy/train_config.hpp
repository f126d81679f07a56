// Launch parameters of the CUDA training kernels, one comment per field. Tile shapes are
// compile-time (the kernels are templates over them); SM counts come from the device (DeviceInfo).
#pragma once
#include <cstdint>

#include "cuda/policy/config.hpp"

namespace twell::gpu {

// The widest TwELL tile the backend packs: bounds the per-tile shared arrays.
constexpr int32_t kMaxTileWidth = kTileWidths[sizeof(kTileWidths) / sizeof(kTileWidths[0]) - 1];

// The compact-row passes (forward_rows.cu, backward_rows.cu): K a multiple of 256 up
// to 2048: a warp per row, long rows split over a CTA's warps; other K: one CTA per row
// (CtaRowConfig, config.hpp).
struct TrainRowConfig {
  static constexpr int kWarpRowWarps = 4;       // warp kernel: warps (rows in flight) per CTA
  // warp kernel: persistent CTAs per SM, rows from a queue; also its launch bound's minimum, which
  // lets ptxas keep 12 of a step's 16 weight-row loads in flight (96 registers and 2 loads without)
  static constexpr int kWarpRowCtasPerSm = 3;
  static constexpr int kLongRow = 256;          // entries above which a row goes to the long-row kernel
  // Determinism::fast: a compact row with more entries than N / kRouteRowDivisor (clamped to
  // [kRouteRowMin, kRouteRowMax]; 128 at N = 5632) is routed by the forward
  // (launch_route_overflow): the routed rows' dense products run through cuBLAS, and a row several
  // times the mean would hold up the end of the warp kernels' queue.
  static constexpr int64_t kRouteRowDivisor = kHeavyRowDivisor;
  static constexpr int64_t kRouteRowMin = 96;
  static constexpr int64_t kRouteRowMax = 512;
  static constexpr int kLongRowWarps = 4;       // long-row kernel: warps splitting one row's entry groups
  static constexpr int kLongRowCtasPerSm = 4;   // long-row kernel: CTAs per SM, grid-stride over the list
};

// The per-neuron column index of the compact entries (column_index.cu).
struct ColumnIndexConfig {
  static constexpr int kThreads = 256;          // per CTA of the count and rank kernels
  static constexpr int kRowsPerBlock = 256;     // rows of one (row block, tile) CTA
  static constexpr int kChunkRows = 64;         // rows of one mask word: one bit each in a uint64
  static constexpr int kOffsetThreads = 256;    // per CTA of the per-neuron offsets kernel (one neuron each)
  static constexpr int kOffsetBatch = 16;       // offsets kernel: row blocks whose counts are loaded at once
  static constexpr int kScanThreads = 1024;     // the single CTA of the column-pointer scan
};

// The ascending list of routed rows (routed_order.cu).
struct RoutedOrderConfig {
  static constexpr int kThreads = 1024;         // the single CTA
  static constexpr int kRowsPerThread = 16;     // consecutive rows a thread flags per step
};

// Weight gradients of the compact entries (weight_grads.cu). A (neuron, 256-column slice) of
// a neuron with at most heavy_threshold entries is one warp's item; heavier neurons are split over
// a CTA's warps and lane groups, a 64-column quarter of a slice per CTA.
struct WeightGradConfig {
  static constexpr int kWarps = 8;              // warp kernel: warps per CTA (each takes items from a queue)
  static constexpr int kCtasPerSm = 2;          // warp kernel: persistent CTAs per SM
  static constexpr int kBatch = 8;              // entries whose x / dy vectors a lane loads at once
  static constexpr int kHeavyMin = 128;         // heavy_threshold = max(kHeavyMin, kHeavyFactor x mean
  static constexpr int kHeavyFactor = 4;        //   entries per neuron)
  static constexpr int kHeavyWarps = 8;         // heavy kernel: warps per CTA
  static constexpr int kHeavyGroups = 4;        // heavy kernel: lane groups per warp (8 lanes, 64 columns)
  static constexpr int kHeavyBatch = 4;         // heavy kernel: entries a lane group loads at once
  static constexpr int kHeavyCtasPerSm = 3;     // heavy kernel: persistent CTAs per SM
  // Warp kernel: rows per pass (a multiple of ColumnIndexConfig::kRowsPerBlock). A 256-column
  // slice of x and dy over this many rows (32 MB in 16-bit types) stays in L2 while every neuron
  // reads it; the passes add their sums in row order. M = 262144 in one pass (256 MB a slice) ran
  // the kernel at half its per-entry speed.
  static constexpr int64_t kChunkRows = 32768;
};
static_assert(WeightGradConfig::kChunkRows % ColumnIndexConfig::kRowsPerBlock == 0,
              "a weight-gradient pass covers whole row blocks of the column index");

// Backward's routed rows in chunks (training/workspace.cpp, routed_chunk_rows). Their dense rows (p:
// g then h; q: [u | dh] then [dg | du]) take 3 N values a row gated, 2 N plain: at R = M that is
// more than anything else backward holds. Above kMinBytes for all M rows, the rows go in chunks
// (each with its own launches) that fit in the bytes the column index's records hold before them
// (6 chunks gated, 4 plain at the default capacity): the step's scratch is no larger than its records.
struct RoutedChunkConfig {
  static constexpr size_t kMinBytes = size_t(32) << 20;
  static constexpr int64_t kRowMultiple = 64;  // a chunk's rows (RoutedBlasConfig::kRowMultiple too)
};

// The elementwise backward of the routed rows (routed_hidden.cu).
struct TrainElementwiseConfig {
  static constexpr int kThreads = 256;   // threads per CTA
  static constexpr int kCtasPerSm = 8;   // grid-stride CTAs per SM
};

// The statistics reduction (stats.cu).
struct TrainStatsConfig {
  static constexpr int kThreads = 256;   // the single CTA reducing the per-row L1 sums; also the CTA
                                         // size of the routed-row L1 kernel (one CTA per row)
  static constexpr int kCtasPerSm = 4;   // routed-row L1: persistent CTAs per SM
};

}  // namespace twell::gpu
