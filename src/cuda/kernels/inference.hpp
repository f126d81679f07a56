// Launchers of the CUDA inference kernels (host-callable, stream-taking, graph-capturable: they
// only enqueue). Every pointer is device memory on the current device; shapes were checked by
// the plan (K, N multiples of 8; tile 64/128/256; 16-bit float dtypes).
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "cuda/policy/config.hpp"
#include "cuda/policy/problem.hpp"
#include "cuda/runtime/device.hpp"
#include "twell/dtype.hpp"
#include "twell/ffn.hpp"
#include "twell/format.hpp"

namespace twell::gpu {

class LtGemm;  // lt_gemm.hpp

// Per-run device counters, zeroed by the plan before the first kernel of a run.
struct RunCounters {
  int32_t num_routed = 0;       // rows routed to the dense backup (TwellView::num_routed)
  int32_t num_heavy = 0;        // rows the row kernels leave to the tensor-core backup (row_ffn.cu)
  unsigned long long active = 0;  // non-zero gate activations over all rows
  // The row kernels' work queue heads, one per kernel launch (row_ffn.cu): the row kernel's
  // dots (or fused) passes [0, kMaxPasses), its axpys passes, then the long-row passes' two sets.
  int32_t row_queue[4 * RowConfig::kMaxPasses] = {};
  int32_t num_long = 0;         // compact rows deferred to the long-row kernel (row_ffn.cu)
  int32_t next_long = 0;        // the long-row kernel's work queue head
  int32_t split_tiles[RoutedGemmConfig::kMaxSplitTiles] = {};  // routed GEMMs' split-K arrivals
};

// Scratch of the routed GEMMs' split-K (routed_gemm.cu): fp32 partial tiles
// [RoutedGemmConfig::kSplitPartialBytes] and per-tile arrival counters
// [RoutedGemmConfig::kMaxSplitTiles], zero on entry (each launch leaves them zero). Null: no split.
struct SplitK {
  float* partials = nullptr;
  int32_t* counters = nullptr;
};

// pack.cu: G = x W1^T [rows, cols] (before the ReLU, out.dtype) -> TwELL `out` of relu(G) (values,
// cols, counts, row_slot, routed_rows, num_routed; no backup rows). *out.num_routed must be 0 on
// entry; it ends as the routed row count, in routed_rows' first entries (in no particular order).
// Routed rows (a tile over capacity, or a NaN or infinite G value) get zero counts and their G
// rows replaced by relu(G) (gated: -Inf by NaN, see pack.cu). Adds the active entries (positive or
// NaN) of every row to *active.
struct PackArgs {
  FfnKind kind = FfnKind::gated;
  void* hidden = nullptr;
  TwellView out;
  unsigned long long* active = nullptr;
};
void launch_pack(const PackArgs& a, const DeviceInfo& dev, cudaStream_t s);

// gate_pack.cu (sm_90a): G = relu(x W1^T) packed into `out` by the GEMM itself: the layout
// launch_pack gives the same G (*out.num_routed must be 0 on entry), with `hidden` (relu(G)
// [rows, cols], as launch_pack leaves it) written only for routed rows. Internally a (row, tile)
// over the capacity or with a NaN or infinite value writes its dense values to G with count
// kOverflowCount and marks its row kOverflowRow; the caller then routes those rows
// (launch_route_overflow, before anything reads the layout).
// Adds the active entries of every row to *active.
struct GatePackArgs {
  const char* op = "InferencePlan::run";
  FfnKind kind = FfnKind::gated;  // a gated layer's routed -Inf becomes NaN (pack.cu)
  const void* x = nullptr;       // [rows, k]
  const void* weight = nullptr;  // W1 [cols, k]
  int64_t k = 0;
  TwellView out;
  void* hidden = nullptr;
  unsigned long long* active = nullptr;
  // Overlap (gate_ready_blocks): non-null, the packers add 1 per packer warp to ready[b] once the
  // 128-row block b's tile of a column block is packed (a release; gate_ready_target in all); the
  // overflow routing then waits until the kernel launched after the gate, which may start on the
  // SMs the gate's last wave frees, has read the marks (launch_row_ffn's route_overflow).
  int32_t* ready = nullptr;
};
constexpr uint16_t kOverflowCount = 0xffffu;
constexpr int32_t kOverflowRow = -2;
// True where the fused kernel runs: a compute capability 9.0 device and a build with sm_90a.
bool gate_pack_available(const DeviceInfo& dev);
void launch_gate_pack(const GatePackArgs& a, const DeviceInfo& dev, cudaStream_t s);
// The overlap's row blocks (GatePackConfig::kBlockM rows each) for `rows` rows: the length of the
// ready array (zero on entry), and the count at which a block is complete for N = cols.
int64_t gate_ready_blocks(int64_t rows);
int32_t gate_ready_target(int64_t cols);
// Whether the inference row stage overlaps the fused gate: yes unless TWELL_NO_OVERLAP is set
// (development A/B runs; the row stage then starts once the gate has completed).
bool gate_overlap_enabled();

// pack.cu: after the fused kernel, every row marked kOverflowRow becomes routed (a routed_rows
// entry and slot, zero counts) and its G row in `hidden` is completed from its compact tiles, so
// the layout is the one launch_pack gives. With route_above >= 0, so does every compact row with
// more than route_above entries (training routes long rows to the dense backup, which computes
// them faster than the row kernels); after launch_pack, that is all it does (G is complete there).
void launch_route_overflow(const TwellView& out, void* hidden, const DeviceInfo& dev, cudaStream_t s,
                           const char* op, int32_t route_above = -1);

// compact_ffn.cu: y[m] = sum over the TwELL entries (n, g) of compact row m of h * Wd[n], with
// h = g * dot(x[m], Wu[n]) (gated) or h = g (plain). Rows with row_slot >= 0 are left untouched.
struct CompactArgs {
  FfnKind kind = FfnKind::gated;
  const void* x = nullptr;     // [rows, K]
  const void* up = nullptr;    // Wu [N, K]
  const void* down = nullptr;  // Wd [N, K]
  void* y = nullptr;           // [rows, K]
  int64_t hidden = 0;          // K
  TwellView twell;             // rows, cols = N, tile, capacity, dtype
};
void launch_compact_ffn(const CompactArgs& a, cudaStream_t s);

// row_ffn.cu: the up + down over compact rows for K a multiple of 256. A warp takes each compact
// row of at most RowArgs::long_row entries (rows from a queue) and lists the longer ones in
// long_rows. K <= RowConfig::kMaxHidden: a second kernel gives each long row and each routed row
// to a whole CTA (its warps split the row's neurons, partial sums meet in shared memory), so no
// row 10-40x denser than the mean holds up the end of the run; routed rows are scanned straight
// from G. Rows with more than N / RowConfig::kDenseRowDivisor active neurons (clamped), compact
// (written densely into their G rows) or routed, go to heavy_rows / *num_heavy for the tensor-core
// backup. Larger K runs in passes over column ranges of at most RowConfig::kMaxHidden, the long
// rows too (a CTA per row); the first pass lists every routed row and those long rows for the
// backup.
struct RowArgs {
  CompactArgs compact;
  const void* hidden = nullptr;  // G [rows, N], before the ReLU: relu(G) in the routed rows (launch_pack)
  int32_t* heavy_rows = nullptr; // [rows]
  int32_t* long_rows = nullptr;  // [rows]
  RunCounters* control = nullptr;
  // Overlap with the fused gate (GatePackArgs::ready): the first dots kernel is launched right
  // after the gate, starts while it runs, and takes a row only once ready[row / kBlockM] reaches
  // ready_target; the overflow routing follows it (route_overflow). Split (row_kernel_splits) only.
  const int32_t* ready = nullptr;
  int32_t ready_target = 0;
  bool route_overflow = false;
  // Compact rows of more entries than this (at most RowConfig::kLongRow) go to the long-row
  // kernels (a CTA each) instead of one warp.
  int32_t long_row = RowConfig::kLongRow;
};
// Whether launch_row_ffn takes a layer: K a multiple of 256 up to ShapeLimits::kMaxHidden; a gated
// layer whose K needs passes keeps its h values in G's rows, which takes N >= 2 kLongRow.
bool row_kernel_supports(FfnKind kind, int64_t k, int64_t n);
// Whether it also computes the routed rows (all but the heavy ones): K <= RowConfig::kMaxHidden.
bool row_kernel_routes(int64_t k);
// Whether it runs as a dots and an axpys kernel (gated, N >= 2 RowConfig::kLongRow).
bool row_kernel_splits(FfnKind kind, int64_t n);
void launch_row_ffn(const RowArgs& a, const DeviceInfo& dev, cudaStream_t s);

// What the stages past the gate take (the routed rows, the decode paths): the problem, x, the up
// and down weights, y.
struct UpDownProblem {
  FfnKind kind = FfnKind::gated;
  DType dtype = DType::bf16;
  const void* x = nullptr;     // [rows, K]
  const void* up = nullptr;    // Wu [N, K]
  const void* down = nullptr;  // Wd [N, K]
  void* y = nullptr;           // [rows, K]
  int64_t rows = 0, k = 0, n = 0;
};
inline UpDownProblem up_down_problem(const ProblemDims& d, const FfnWeights& w, const void* x, void* y,
                                     int64_t rows) {
  UpDownProblem p;
  p.kind = d.kind;
  p.dtype = d.dtype;
  p.x = x;
  p.up = w.up.data;
  p.down = w.down.data;
  p.y = y;
  p.rows = rows;
  p.k = d.k;
  p.n = d.n;
  return p;
}

// routed_gemm.cu: exact dense rows for the *num_routed rows listed in routed_rows, on tensor
// cores. Gated: G[r] <- G[r] * (x[r] Wu^T) in place, then (both kinds) y[r] = G[r] Wd. rows: M,
// the worst case for the persistent grids.
struct RoutedArgs : UpDownProblem {
  void* hidden = nullptr;             // G [rows, N]; routed rows become h (gated)
  const int32_t* routed_rows = nullptr;
  const int32_t* num_routed = nullptr;
  int64_t first = 0;                  // rows routed_rows[first .. *num_routed) (the ones before: cuBLAS)
  SplitK split_k;
};
void launch_routed(const RoutedArgs& a, const DeviceInfo& dev, cudaStream_t s);

// routed_blas.cu: the first `cap` rows of a routed list (list[0 .. *count)) for cuBLAS.
struct RowList {
  const int32_t* list = nullptr;
  const int32_t* count = nullptr;  // R, on the device
  int64_t cap = 0;                 // C, chosen on the host
};
// The largest C (a multiple of RoutedBlasConfig::kRowMultiple, at most rows) whose buffers of
// bytes_per_row each fit `budget` bytes.
int64_t routed_blas_rows(int64_t rows, size_t bytes_per_row, size_t budget = RoutedBlasConfig::kBytes);
// Bytes per row of launch_routed_blas's region: a K-wide and an N-wide row of the dtype.
inline size_t routed_blas_row_bytes(const ProblemDims& d) { return size_t(d.k + d.n) * dtype_size(d.dtype); }
// dst [cap, width] = src[list[i]] for i < min(cap, R), zero rows after (16-bit, width % 8 == 0).
void launch_gather_rows(const void* src, int64_t width, const RowList& l, void* dst, const DeviceInfo& dev,
                        cudaStream_t s, const char* op);
// Gated: h = g * u, rounded once, for i < min(cap, R): into up[i] and hidden[list[i]] ([*, n]).
void launch_routed_product(DType dtype, void* hidden, int64_t n, const RowList& l, void* up,
                           const DeviceInfo& dev, cudaStream_t s, const char* op);
// dst[list[i]] = src[i] for i < min(cap, R); src 16-bit, or fp32 (src_f32) rounded to dtype.
void launch_scatter_rows(DType dtype, const void* src, bool src_f32, int64_t width, const RowList& l, void* dst,
                         const DeviceInfo& dev, cudaStream_t s, const char* op);
// launch_routed's products for rows [0, min(cap, R)) of a.routed_rows through cuBLASLt, in
// `region` (cap x (K + N) values): x rows gathered, u = x Wu^T, h = g u (into G too), y = h Wd
// scattered. lt_workspace: LtConfig::kWorkspaceBytes.
void launch_routed_blas(LtGemm& lt, const RoutedArgs& a, int64_t cap, void* region, void* lt_workspace,
                        const DeviceInfo& dev, cudaStream_t s, const char* op);

// The backup of a run of `rows` rows over the rows listed in list[0 .. *count).
inline RoutedArgs routed_args(const ProblemDims& d, const FfnWeights& w, const void* x, void* y,
                              void* hidden, int64_t rows, const int32_t* list, const int32_t* count) {
  RoutedArgs r;
  static_cast<UpDownProblem&>(r) = up_down_problem(d, w, x, y, rows);
  r.hidden = hidden;
  r.routed_rows = list;
  r.num_routed = count;
  return r;
}

// dense_hidden.cu: from G = x W1^T (before the ReLU), counts the active values (positive or NaN)
// into *active and writes h = relu(G) * U (gated; each product rounded to dtype, as a framework's
// dense layer does) or h = relu(G) (plain).
struct DenseHiddenArgs {
  FfnKind kind = FfnKind::gated;
  DType dtype = DType::bf16;
  void* hidden = nullptr;         // G [rows, N]
  const void* up = nullptr;       // U = x Wu^T [rows, N] (gated only)
  void* out = nullptr;            // h [rows, N]; nullptr: h replaces G in place
  int64_t elements = 0;           // rows * N (a multiple of 8)
  unsigned long long* active = nullptr;
  // Optional (training's dense form): sum |h| of the rounded h per CTA, at most
  // ElementwiseConfig::kMaxPartials of them, each over a fixed set of vectors (deterministic).
  float* l1_partials = nullptr;
};
// Returns the grid: with l1_partials, the number of sums written.
int64_t launch_dense_hidden(const DenseHiddenArgs& a, const DeviceInfo& dev, cudaStream_t s);

// counters.cu: counters (int64 [2]) = {num_routed, active}.
void launch_write_counters(const RunCounters* c, int64_t* counters, cudaStream_t s);

// What both decode paths take: the problem and the run's active total.
struct DecodeProblem : UpDownProblem {
  unsigned long long* active = nullptr;  // the active entries (RunCounters::active): added to
                                         // (two-kernel path) or written (fused kernel)
};

// decode.cu: the decode path's two kernels after the gate GEMM (G = x W1^T in `hidden`).
// Lists per (token, chunk of DecodeConfig::kChunk neurons): counts [M, chunks] int32,
// neurons and h [M, chunks, kChunk] (int32, fp32). partials: [splits, M, K] fp32 when
// decode_grid(...).splits > 1; arrivals: int32 [M, slices], zero before the launch.
struct DecodeArgs : DecodeProblem {
  const void* hidden = nullptr;  // G [rows, N], before the ReLU
  int64_t chunks = 0;
  int32_t* counts = nullptr;
  int32_t* neurons = nullptr;
  float* h = nullptr;
  float* partials = nullptr;
  int32_t* arrivals = nullptr;
};
struct DecodeGrid {
  int64_t slices = 1;  // column slices of K
  int64_t splits = 1;  // CTAs sharing a (token, slice)'s entries
};
DecodeGrid decode_grid(int64_t rows, int64_t k, const DeviceInfo& dev);
void launch_decode(const DecodeArgs& a, const DeviceInfo& dev, cudaStream_t s);

// decode_fused.cu: the whole decode path in one cooperative kernel for M <= FusedDecodeConfig::kMaxRows
// (GateKernel::automatic; the shapes fused_decode_setup takes). h: [M, N] fp32 (only listed entries
// are written or read); bitmap: [M, ctas, words] uint32, every word written by the kernel. Nothing
// needs zeroing before the launch: the kernel writes *active and counters itself.
struct FusedDecodeArgs : DecodeProblem {
  const void* first = nullptr;  // W1 [N, K]: the gate weight (gated) or the up weight (plain)
  float* h = nullptr;
  uint32_t* bitmap = nullptr;
  int64_t* counters = nullptr;  // optional: {0, active} written after the barrier (InferenceArgs)
};
// How the grid splits the problem (fused_decode_setup).
struct FusedDecodeShape {
  int cta_rows = 0;    // W1 rows per CTA, contiguous: CTA b owns [b cta_rows, (b + 1) cta_rows)
  int words = 0;       // bitmap words per CTA and token: ceil(cta_rows / 32)
  int slice_cols = 0;  // columns of K per down work item
};
using FusedDecodeKernel = void (*)(FusedDecodeArgs, FusedDecodeShape);
// The grid of one M on one device: ctas = 0 when the kernel does not take it (then the two-kernel
// decode path runs).
struct FusedDecodeLaunch {
  FusedDecodeKernel kernel = nullptr;  // the instantiation for the plan's kind, dtype and M
  int ctas = 0;                        // one per SM
  FusedDecodeShape shape;
  size_t smem = 0;                     // dynamic shared memory
};
// Index: M (0 unused).
using FusedDecodeLaunches = std::array<FusedDecodeLaunch, FusedDecodeConfig::kMaxRows + 1>;
// Once per plan (on the plan's device): sets each token-tile kernel's shared-memory limit once and
// sizes every M's grid.
FusedDecodeLaunches fused_decode_setup(FfnKind kind, DType dtype, int64_t k, int64_t n, const DeviceInfo& dev);
// False when the device cannot hold the grid at once now (nothing enqueued): run the two-kernel path.
bool launch_fused_decode(const FusedDecodeArgs& a, const FusedDecodeLaunch& l, cudaStream_t s);

}  // namespace twell::gpu
