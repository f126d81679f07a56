// Launchers of the CUDA training kernels (host-callable, stream-taking, graph-capturable: they only
// enqueue). Every pointer is device memory on the current device; shapes were checked by the plan
// (K, N multiples of 8; tile 64/128/256; 16-bit float dtypes). `saved` is the training layout of
// docs/format.md (gated: planes {relu(g), u}; plain: plane {h}; no backup rows).
// The routed row count R exists only on the device: kernels over routed rows read it and exit
// past it, their grids sized for R = M.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/inference.hpp"
#include "cuda/runtime/device.hpp"
#include "cuda/runtime/lt_gemm.hpp"
#include "twell/dtype.hpp"
#include "twell/ffn.hpp"
#include "twell/format.hpp"

namespace twell::gpu {

// The L1 coefficient: read on the device when `device` is set, else `host`. The gradient of the
// L1 term w.r.t. h is coefficient * sign(h) / rows.
struct L1Coef {
  const float* device = nullptr;
  float host = 0.0f;
};

// The int32 control words of a warp-per-row pass (forward or backward): the dots (or fused)
// kernel's queue head, the long-row count, the axpys kernel's queue head, and (backward) the flag
// the backward rows kernels raise where a compact row's dy holds a NaN or Inf.
constexpr int kRowQueueWords = 4;
constexpr int kNonFiniteDyWord = 3;

// forward_rows.cu: for every compact row m and entry (n, g) of `saved`:
//   gated: u = <x[m], Wu[n]> rounded to the dtype, stored in plane 1; h = g * u
//   plain: h = g
//   y[m] = sum h Wd[n] (rounded once); row_l1[m] = sum |h| (when row_l1 is set).
// Routed rows are left untouched.
struct ForwardRowsArgs {
  CompactArgs compact;         // x, Wu, Wd, y, K and the saved layout (inference.hpp)
  float* row_l1 = nullptr;     // [rows], optional
  // Scratch of the warp-per-row kernels (K a multiple of 256 up to 2048): int32 [kRowQueueWords]
  // (zeroed by the launcher) and int32 [rows], the long rows.
  int32_t* control = nullptr;
  int32_t* long_rows = nullptr;
};
void launch_forward_rows(const ForwardRowsArgs& a, const DeviceInfo& dev, cudaStream_t s);

// One compact entry in column-index order: its row and the coefficients of its three weight
// gradients (fp32): first = dh u (gated) or dh (plain), up = dh g (gated), down = g u (gated) or g.
struct alignas(16) EntryRecord {
  int32_t row;
  float first;
  float up;
  float down;
};

// backward_rows.cu: for every compact row m and entry at slot i (neuron n, g, u):
//   dh = <dy[m], Wd[n]> + l1 * sign(h) / rows;  dg = dh * u (gated) or dh (plain); du = dh * g
//   dx[m] = sum dg W1[n] + du Wu[n] (rounded once). Routed rows are left untouched.
//   records[col_ptr[n] + position[i]] = {m, dh u, dh g, g u} (plain: u = 1).
struct BackwardRowsArgs {
  FfnKind kind = FfnKind::gated;
  const void* dy = nullptr;     // [rows, K]
  const void* first = nullptr;  // W1 = Wg (gated) or Wu (plain), [N, K]
  const void* up = nullptr;     // Wu [N, K] (gated)
  const void* down = nullptr;   // Wd [N, K]
  void* dx = nullptr;           // [rows, K]
  const int64_t* col_ptr = nullptr;   // [N + 1] and
  const int32_t* position = nullptr;  // [rows * slots_per_row]: each entry's record (launch_column_index)
  EntryRecord* records = nullptr;     // the column index's records, written there
  L1Coef l1;
  int64_t k = 0;
  TwellView saved;
  int32_t* control = nullptr;    // as ForwardRowsArgs; also control[kNonFiniteDyWord] (zeroed here)
  int32_t* long_rows = nullptr;
};
void launch_backward_rows(const BackwardRowsArgs& a, const DeviceInfo& dev, cudaStream_t s);

// nonfinite_dy.cu: last in a backward over the compact form, where a compact row's dy holds a
// NaN or Inf, the NaNs the dense products have and the compact-row kernels skip (the row's
// inactive neurons): gated, all of dx[m] and dWu[n] for n inactive in row m; both kinds,
// dWd[n, k] for n inactive and dy[m, k] not finite. Exits at once while *flag
// (launch_backward_rows's control[kNonFiniteDyWord]) is 0.
struct NonFiniteDyArgs {
  FfnKind kind = FfnKind::gated;
  const void* dy = nullptr;  // [rows, K]
  TwellView saved;
  void* dx = nullptr;        // [rows, K]
  float* dup = nullptr;      // dWu [N, K] (gated)
  float* ddown = nullptr;    // [N, K]
  int64_t k = 0;
  const int32_t* flag = nullptr;
};
void launch_nonfinite_dy(const NonFiniteDyArgs& a, const DeviceInfo& dev, cudaStream_t s);

// routed_order.cu: the saved layout's routed rows renumbered in ascending order (routed_rows
// ascending, row_slot their positions), so the bytes forward saves do not depend on the order of
// the pack's atomics: what torch.compile's checks (eager vs traced outputs) need, and the order in
// which backward's dense reductions over routed rows add them (deterministic training).
void launch_routed_renumber(const TwellView& saved, cudaStream_t s);

// column_index.cu: the per-neuron view of the compact entries: position[slot] is the entry's place
// among its neuron's records (col_ptr[n] + position[slot] is where its record goes, an int32 since
// a neuron has at most M entries), so that records[col_ptr[n] .. col_ptr[n+1]) are neuron n's
// entries, rows ascending (launch_backward_rows stores them), and heavy = {H, threshold, the H
// neurons with more entries than the threshold, ascending}: the neurons whose weight gradients
// are split over a CTA (threshold = max(kHeavyMin, kHeavyFactor x the mean entries per neuron)). Reads the layout alone,
// so it runs before the backward rows. Deterministic.
struct ColumnIndexArgs {
  TwellView saved;
  int32_t* block_counts = nullptr;  // [column_index_blocks(rows), N] scratch
  int32_t* col_totals = nullptr;    // [N] scratch
  int64_t* col_ptr = nullptr;       // [N + 1]
  int32_t* heavy = nullptr;         // [N + 2]
  int32_t* position = nullptr;      // [rows * slots_per_row]: written at the compact entries' slots
};
int64_t column_index_blocks(int64_t rows);
void launch_column_index(const ColumnIndexArgs& a, cudaStream_t s);

// weight_grads.cu: the compact entries' weight gradients, written (not accumulated):
//   dW1[n] = sum dg x[m];  dWu[n] = sum du x[m] (gated);  dWd[n] = sum h dy[m]
// over neuron n's records (fp32, in an order fixed by the column index: deterministic).
struct WeightGradArgs {
  FfnKind kind = FfnKind::gated;
  DType dtype = DType::bf16;
  const void* x = nullptr;        // [rows, K]
  const void* dy = nullptr;       // [rows, K]
  int64_t n = 0;                  // neurons
  const int64_t* col_ptr = nullptr;
  const int32_t* heavy = nullptr;
  const EntryRecord* records = nullptr;
  const int32_t* block_offsets = nullptr;  // the column index's block_counts after its offsets pass
  int64_t rows = 0;                        // M
  int32_t* queue = nullptr;       // [weight_grad_passes(rows)]: the warp kernel's item queues (reset here)
  float* dfirst = nullptr;        // dWg (gated) or dWu (plain), [N, K]
  float* dup = nullptr;           // dWu (gated only), [N, K]
  float* ddown = nullptr;         // [N, K]
  int64_t k = 0;
};
// The warp kernel's passes over row ranges of WeightGradConfig::kChunkRows (at least 1).
int64_t weight_grad_passes(int64_t rows);
void launch_weight_grads(const WeightGradArgs& a, const DeviceInfo& dev, cudaStream_t s);

// Backward's routed rows in chunks (training/workspace.hpp, routed_chunk_rows): one chunk's launches
// take the rows s in [first, min(R, end)), whose dense rows (grad, out, p, q) are rows s - base of
// their buffers. The default is one chunk of every row.
struct RoutedChunk {
  int64_t base = 0;
  int64_t end = INT64_MAX;
};

// The routed rows one of routed_gemm.cu's launches takes: rows s in [first, min(max_rows, chunk.end))
// of the routed list (order, count); s >= *count is skipped on the device. Their dense rows are
// rows s - chunk.base of the chunk's buffers.
struct RoutedRange {
  const int32_t* order = nullptr;
  const int32_t* count = nullptr;
  int64_t max_rows = 0;              // M: the worst case R
  int64_t first = 0;                 // only s >= first (the rows before: cuBLAS)
  RoutedChunk chunk;
};

// routed_gemm.cu (shared with the inference backup): tensor-core GEMMs over the R routed rows (fp32
// accumulation). What the three launches share: their rows, the dtype, K and the split-K scratch
// (rows problems only: the weight gradient, whose reduction the routed rows are, never splits).
struct RoutedGemm {
  RoutedRange range;
  DType dtype = DType::bf16;
  int64_t k = 0;
  SplitK split_k;
};

// Recompute: out[s] = src[order[s]] W^T, s < R; src [rows, K], W [n_out, K], out [R, ldo].
struct RecomputeArgs {
  RoutedGemm gemm;
  const void* src = nullptr;
  const void* weight = nullptr;
  void* out = nullptr;
  int64_t ldo = 0;
  int64_t n_out = 0;
};
void launch_routed_recompute(const RecomputeArgs& a, const DeviceInfo& dev, cudaStream_t s);

// A [depth, K] weight stacked from two: rows k < split from `first`, the others from `second`.
struct StackedWeight {
  const void* first = nullptr;
  const void* second = nullptr;
  int64_t split = 0;
};

// Input gradient: dx[order[s]] = grad[s, :depth] [W1; Wu] for s < R (gated: the stacked weight
// with depth = 2N, split = N; plain: W1 alone, split = depth). grad [R, depth] (ld depth),
// weights [N, K], dx [rows, K].
struct InputGradArgs {
  RoutedGemm gemm;
  const void* grad = nullptr;
  int64_t depth = 0;
  StackedWeight weight;
  void* dx = nullptr;
};
void launch_routed_input_grad(const InputGradArgs& a, const DeviceInfo& dev, cudaStream_t s);

// Weight gradient: dw[n, :] += sum_{s < R} grad[s, n] src[order[s], :]; grad [R, lda] (the N
// columns used start at `grad`), src [rows, K], dw [N, K] fp32. R = 0 leaves dw untouched.
// gemm.range.max_rows and gemm.split_k are unused (the routed rows are the reduction).
struct WeightGradGemmArgs {
  RoutedGemm gemm;
  const void* grad = nullptr;
  int64_t lda = 0;
  const void* src = nullptr;
  float* dw = nullptr;
  int64_t n = 0;
};
void launch_routed_weight_grad(const WeightGradGemmArgs& a, const DeviceInfo& dev, cudaStream_t s);

// The hidden layer's elementwise backward (routed_hidden.cu, train_dense.cu), with
// dh += l1 * sign(h) / rows at the active entries.
struct HiddenGradProblem {
  FfnKind kind = FfnKind::gated;
  DType dtype = DType::bf16;
  int64_t n = 0;     // N
  int64_t rows = 0;  // M: the L1 normalisation (routed: also the worst case R)
  L1Coef l1;
};

// routed_hidden.cu: the elementwise backward of the R routed rows, in place, from
// g = x W1^T before the ReLU:
//   gated: p = g -> h = relu(g) u;  q = [u | dh] -> [dg | du]
//   plain: p = g -> h = relu(g);  q = dh -> dg (zero where g is not active)
// p [R, N], q [R, N * (gated ? 2 : 1)], all rounded to the dtype.
struct RoutedHiddenArgs {
  HiddenGradProblem problem;
  void* p = nullptr;
  void* q = nullptr;
  const int32_t* count = nullptr;
  RoutedChunk chunk;  // rows s in [chunk.base, min(R, chunk.end)), p / q row s - base
};
void launch_routed_hidden(const RoutedHiddenArgs& a, const DeviceInfo& dev, cudaStream_t s);

// train_dense.cu: the dense path's saved layout (every row routed to its own backup row:
// row_slot[m] = routed_rows[m] = m, *num_routed = M, counts 0; the backup planes are written by
// the caller's GEMMs).
void launch_dense_layout(const TwellView& saved, const DeviceInfo& dev, cudaStream_t s);

// train_dense.cu: the dense path's elementwise backward over [rows, N], with g = relu(G):
//   t = dh + l1 * sign(g u) / rows; gated: q = [t u [G active] | t g] (row width 2N), h = g u;
//   plain: q = t [G active] (width N). Every output rounded to the dtype.
struct DenseBackwardArgs {
  HiddenGradProblem problem;
  const void* g = nullptr;   // G [rows, N]: x Wg^T (gated), relu(x Wu^T) (plain)
  const void* u = nullptr;   // U [rows, N] (gated)
  const void* dh = nullptr;  // dy Wd^T [rows, N]
  void* q = nullptr;         // [rows, 2N] gated, [rows, N] plain
  void* h = nullptr;         // [rows, N] (gated); may be dh (each element read before it is written)
};
void launch_dense_backward_hidden(const DenseBackwardArgs& a, const DeviceInfo& dev, cudaStream_t s);

// stats.cu: row_l1[r] = sum |h[r, :]| for the routed rows r (h: the dense hidden rows the
// routed-row backup left in `hidden` [rows, N]); then stats = {active / rows, sum row_l1 / rows}.
struct StatsArgs {
  DType dtype = DType::bf16;
  const void* hidden = nullptr;
  int64_t n = 0;
  int64_t rows = 0;
  const int32_t* routed_rows = nullptr;
  const int32_t* num_routed = nullptr;
  const unsigned long long* active = nullptr;
  float* row_l1 = nullptr;
  float* stats = nullptr;
  // > 0 (the dense form): row_l1 already holds this many sums of |h| (launch_dense_hidden's per-CTA
  // sums), summed as they are, with no routed-row pass.
  int64_t partials = 0;
};
void launch_stats(const StatsArgs& a, const DeviceInfo& dev, cudaStream_t s);

// saved_state.cu: forward's last kernel seals the saved buffer with its header; backward checks the
// whole buffer first (header, routed list, every compact row's counts and columns). A fault is
// written to `flag` (device memory, cleared by the launcher), the buffer emptied so that no later
// kernel indexes with it, and the fault copied to `report` (host-mapped memory; the first fault
// stays until the host clears it) for the plan to raise at its next call.
enum class SavedFaultCode : int32_t { none = 0, header, num_routed, routed_rows, row_slot, count, column };
struct alignas(16) SavedFault {
  int32_t code = 0;   // SavedFaultCode
  int32_t pad = 0;
  int64_t row = -1;   // the row where it was seen (-1: none)
  int64_t value = 0;  // the offending value (the header: the index of the first differing word)
  int64_t pad2 = 0;
};
struct SavedCheckArgs {
  TwellView saved;
  TwellHeader expected;
  SavedFault* flag = nullptr;    // device memory
  SavedFault* report = nullptr;  // host-mapped memory
};
void launch_saved_check(const SavedCheckArgs& a, const DeviceInfo& dev, cudaStream_t s);
void launch_write_header(TwellHeader* dst, const TwellHeader& value, cudaStream_t s, const char* op);

}  // namespace twell::gpu
