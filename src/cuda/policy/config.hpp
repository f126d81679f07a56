// Launch parameters and policy constants of the CUDA inference path, one comment per field.
// Tile shapes are compile-time (the kernels are templates over them); SM counts come from the
// device at plan creation (DeviceInfo), never from a constant.
#pragma once
#include <cstddef>
#include <cstdint>

namespace twell::gpu {

// Shapes the CUDA backend accepts (checked at plan creation, each naming its argument).
struct ShapeLimits {
  static constexpr int64_t kElemsPerVector = 8;        // K and N multiples: 16-byte vectors of 16-bit values
  static constexpr int64_t kMaxHidden = 16384;         // K: a row is held by at most 512 threads x 4 vectors
  static constexpr int64_t kMaxIntermediate = 65536;   // N: a CTA row kernel stages <= 1024 tile counts
  static constexpr size_t kPointerAlign = 16;          // x, y and the weights are read in 16-byte vectors
  static constexpr int kMinComputeMajor = 8;           // bf16 WMMA and cp.async need sm_80 or newer
  // M: rows are int32 indices, and the row queues' int32 heads run past M by one fetch per warp.
  static constexpr int64_t kMaxRows = (int64_t(1) << 31) - (int64_t(1) << 24);
};

// A row with more active neurons than N / kHeavyRowDivisor runs faster on a dense GEMM than on
// the row kernels: the dense backup's cost per row grows with N, the row kernels' with the
// entries. Inference's dense-row rule (RowConfig) and training's forward routing (TrainRowConfig)
// both use it; the runs that placed it are in lab/journal.md ("Tuned constants").
constexpr int64_t kHeavyRowDivisor = 44;

// TwELL tile widths the pack kernel is instantiated for (2, 4 or 8 values per lane), ascending:
// the first bounds a row's tile count (CtaRowConfig::kMaxTiles), the last a tile's width.
constexpr int32_t kTileWidths[] = {64, 128, 256};
static_assert(kTileWidths[0] < kTileWidths[1] && kTileWidths[1] < kTileWidths[2], "tile widths ascending");

// The TwELL pack kernel (pack.cu).
struct PackConfig {
  static constexpr int kWarps = 8;       // warps per CTA; warp w packs tiles w, w + kWarps, ... of a row
  static constexpr int kCtasPerSm = 4;   // persistent grid: CTAs per SM, each walking rows grid-stride
};

// The fused sm_90a gate GEMM + TwELL pack (gate_pack.cu).
struct GatePackConfig {
  static constexpr int kBlockM = 128;  // output rows per tile: two warpgroups of m64n256k16
  static constexpr int kBlockN = 256;  // output columns per tile: one to four TwELL tiles
  static constexpr int kBlockK = 64;   // reduction slice per stage: 128-byte swizzled rows, 48 KB
  static constexpr int kStages = 3;    // TMA ring: 3 x 48 KB of shared memory (+ 64 KB of staged
                                       // rows for the packers)
  static constexpr int kClusterM = 2;  // CTAs of a cluster: row blocks sharing W1's slices, each
                                       // loading half and multicasting it (half the L2 reads)
};

// A K-wide row owned by one CTA (cta_rows.cuh): inference's compact up + down (compact_ffn.cu) and
// training's compact-row passes where the warp kernels do not take K (forward_rows.cu, backward_rows.cu).
struct CtaRowConfig {
  static constexpr int kBatch = 8;              // entries per step; their dots share one barrier
  static constexpr int kVectorsPerThread = 4;   // 16-byte row vectors a thread owns once K >= 1024
  static constexpr int kMaxThreads = 512;       // CTA ceiling: K = 16384 is 512 threads x 4 vectors
  static constexpr int kMaxWarps = kMaxThreads / 32;
  // Tile counts of one row staged in shared memory (N / the narrowest tile).
  static constexpr int kMaxTiles = int(ShapeLimits::kMaxIntermediate / kTileWidths[0]);
};

// The tensor-core GEMMs over routed rows (routed_gemm.cu): inference's backup, training's routed rows.
struct RoutedGemmConfig {
  static constexpr int kBlockM = 64;     // routed rows per CTA tile
  static constexpr int kBlockN = 64;     // output columns per CTA tile
  static constexpr int kBlockK = 32;     // reduction slice per pipeline stage
  static constexpr int kWarpsM = 2;      // warp grid over the CTA tile; each warp owns a
  static constexpr int kWarpsN = 2;      //   (kBlockM / kWarpsM) x (kBlockN / kWarpsN) sub-tile
  static constexpr int kStages = 2;      // cp.async double buffering of the A and B slices
  static constexpr int kCtasPerSm = 4;   // persistent grid: CTAs per SM, walking tiles grid-stride
  // Split-K where the routed rows give fewer output tiles than the grid has CTAs (a few routed
  // rows, a deep reduction): parts of at least kMinSplitSteps slices, at most kMaxSplit per tile
  // and kMaxSplitItems (tile, part) items in all, summed in part order by the tile's last CTA.
  static constexpr int kMaxSplit = 16;
  static constexpr int kMinSplitSteps = 8;
  static constexpr int kMaxSplitItems = 1024;
  static constexpr int kMaxSplitTiles = kMaxSplitItems / 2;  // split tiles have >= 2 parts
  static constexpr size_t kSplitPartialBytes = size_t(kMaxSplitItems) * kBlockM * kBlockN * sizeof(float);
};

// The routed rows' dense products through cuBLAS(Lt) (routed_blas.cu): the first C rows of a
// routed list are gathered into a workspace region of kBytes and multiplied by cuBLAS; rows past C
// take the tensor-core kernel above. C is learned from the routed counts of the plan's earlier
// eager runs (polled, never waited for): kHeadroom x the last count (scaled to this run's M) plus
// kSlack, rounded up to kRowMultiple, at most what kBytes holds.
struct RoutedBlasConfig {
  // 4096 rows of training's backward at K = 2048 (x and dy rows, fp32 dx rows).
  static constexpr size_t kBytes = size_t(64) << 20;
  // Training's backward gives the region the bytes its column-index positions leave free beside
  // cuBLAS's scratch (training/workspace.cpp), at least these: 2048 rows at K = 2048 (heavy-tailed
  // 1% at M = 16384 routes ~1350 rows; 1024 rows of cuBLAS made its step 14% slower).
  static constexpr size_t kBackwardMinBytes = size_t(32) << 20;
  static constexpr int64_t kRowMultiple = 64;
  static constexpr double kHeadroom = 1.25;
  static constexpr int64_t kSlack = 16;
};

// The dense path's elementwise hidden kernel (dense_hidden.cu).
struct ElementwiseConfig {
  static constexpr int kThreads = 256;   // threads per CTA
  static constexpr int kCtasPerSm = 8;   // grid-stride CTAs per SM
  static constexpr int kMaxPartials = 4096;  // grid cap of a pass that writes one sum per CTA
};

// cuBLASLt (lt_gemm.cpp).
struct LtConfig {
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // scratch; NVIDIA's Hopper advice
  static constexpr size_t kMaxCachedPlans = 64;  // (product, M, alignment) plans kept per layer
};

// The warp-per-row fused up + down (row_ffn.cu).
struct RowConfig {
  static constexpr int kWarps = 4;            // warps (rows in flight) per CTA
  static constexpr int kCtasPerSm = 4;        // persistent grid: CTAs per SM, rows from a queue
  static constexpr int kChunk = 256;          // K columns per lane step: 32 lanes x 8 values
  static constexpr int64_t kMaxHidden = 2048; // columns of one pass: the x slice and fp32
                                              // accumulators live in registers; larger K runs
                                              // in passes over column ranges of K
  static constexpr int kMaxPasses = int(ShapeLimits::kMaxHidden / kMaxHidden);
  // Compact rows with more entries than this go to the long-row kernels, split over a CTA's warps.
  static constexpr int kLongRow = 96;
  // Under Determinism::fast, once a density is known, the limit follows it: kLongRowMeans x the
  // mean entries of a row, at least kMinLongRow (at most kLongRow). At the trained models'
  // densities (under one entry a row) a token of 30 - 100 entries otherwise ends the row stage
  // alone, one pair of entries at a time on one warp.
  static constexpr int kLongRowMeans = 4;
  static constexpr int kMinLongRow = 8;
  // Rows with more active neurons than N / kHeavyRowDivisor (at least kLongRow, at most
  // kMaxDenseRow), compact or routed, go to the dense backup, the compact ones written densely
  // into G.
  static constexpr int64_t kDenseRowDivisor = kHeavyRowDivisor;
  static constexpr int kMaxDenseRow = 512;  // also the long-row kernel's list of a routed row's neurons
};

// The decode path (decode.cu): runs of at most kMaxRows rows take it instead of the TwELL pack and
// row kernels (dispatch still times it against dense).
struct DecodeConfig {
  static constexpr int64_t kMaxRows = 64;  // the decode path's largest M
  static constexpr int kThreads = 256;     // per CTA, both kernels
  static constexpr int kChunk = 32;        // neurons per list: one per lane of a ballot; a dense
                                           // token's dots spread over N / kChunk CTAs
  static constexpr int kUnroll = 4;        // 16-byte loads of a row in flight per lane
  static constexpr int kDotsCtasPerSm = 2; // dots: many short CTAs, registers capped to fit two
  static constexpr int kSliceCols = 256;   // columns of K per axpys CTA: 8 per lane
  static constexpr int kAxpyCtasPerSm = 2; // axpys CTAs wanted per SM: few tokens split their
                                           // entries over up to kMaxSplits CTAs per slice
  static constexpr int kMaxSplits = 32;
  static constexpr int64_t kMaxSplitRows = 64;  // splits x M at most (the partials' rows)
  static int64_t chunks(int64_t n) { return (n + kChunk - 1) / kChunk; }
  static int64_t slices(int64_t k) { return (k + kSliceCols - 1) / kSliceCols; }
};

// The single-kernel decode path (decode_fused.cu) for M <= kMaxRows: one CTA per SM owns a
// contiguous run of W1's rows and takes their gate on the tensor cores (W1 straight from global
// memory into registers, x in shared memory); the up dots of its active rows; one grid barrier; then
// the down rows of the active neurons per column slice. A cooperative launch of one CTA per SM.
struct FusedDecodeConfig {
  static constexpr int64_t kMaxRows = 32;   // tokens per call: one, two or four mma tiles of kTileTokens
  static constexpr int kTileTokens = 8;     // the mma tile's n: tokens
  static constexpr int kThreads = 512;      // per CTA, one CTA per SM
  static constexpr int kGroupRows = 16;     // W1 rows per mma tile (its m)
  static constexpr int kPartCols = 1024;    // a chunk: kGroupRows rows x kPartCols columns; each
                                            // warp takes 64 of them (four k16 steps)
  static constexpr int kDepth = 3;          // chunks in flight per warp (16 bytes x 4 per lane each)
  static constexpr int kMaxXParts = 8;      // x in shared memory: token tiles x parts of K at most
  static constexpr int kMaxCtaRows = 256;   // W1 rows per CTA (ceil(N / SMs))
  static constexpr int kUnroll = 8;         // up dots: 16-byte loads of a Wu row in flight per lane
  static constexpr int kSliceCols = 8;      // the narrowest down slice: one vector per entry
  static constexpr int kMaxSliceCols = 256; // the widest: 32 vectors per entry, 16 entries a round
  static constexpr int kEntryUnroll = 4;    // down rows in flight per thread
  static constexpr int64_t kMaxIntermediate = 32768;  // N: a token's list of neurons is uint16
  static constexpr int kWordsPerThread = 4;           // a token's bitmap words per thread (down)
  static constexpr int kMaxTokenWords = kWordsPerThread * kThreads;  // SMs x words per CTA
};

// Dispatch's trials (calibration.hpp). Up to kGraphTimedRows rows a trial runs as a private CUDA
// graph, timed by one replay: there eager runs are bound by kernel launches, not by the GPU, and
// graph replays (decoding, torch.compile) see the GPU time alone.
// Once a regime has chosen, an eager run probes its density (a pinned copy behind an event) only
// every kProbeEvery runs: the probe is host time that small runs feel.
struct DispatchConfig {
  static constexpr int64_t kGraphTimedRows = 256;
  static constexpr int kProbeEvery = 8;
  // Inference runs sparse only where its best trial beats dense's by this fraction: near the
  // crossover the two differ by less than their run-to-run spread, and a wrong pick there cost
  // 3% against dense (M = 4096 at 1%) for a gain of at most this much. Training keeps the plain
  // faster path (its dense form holds more memory than the compact one).
  static constexpr double kSparseMargin = 0.02;
};

}  // namespace twell::gpu
