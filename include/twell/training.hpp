// Training: a forward that saves the compact hybrid layout, and an exact backward with the L1 term.
//
// L1 normalisation (one layer's term, as in the paper's released code; docs/training.md, "The L1
// term"): l1_value = (1/M) * sum_m sum_n |h[m, n]|, i.e. the per-token sum of |h| averaged over
// tokens; the layer's loss term is l1_coef * l1_value and its gradient w.r.t. h is
// l1_coef * sign(h) / M (a model averages the layers' terms: twell.torch.l1_loss).
// L0 = (1/M) * #{(m, n): gate active}, the mean active neurons per token.
//
// What forward saves (docs/format.md, "Hybrid training layout") takes one of two forms, and the
// form of the saved view passed to forward decides the path:
//   compact (backup_capacity 0): a TwELL matrix (gated: planes {relu(x Wg^T), x Wu^T}; plain:
//     plane {h}) whose routed rows (a tile over capacity; on CUDA under Determinism::fast also
//     rows of many entries) are only listed; backward recomputes those rows densely from x. The
//     sparse path.
//   dense (backup_capacity = M, capacity 1, CUDA only): every row routed to its own backup row,
//     which holds the dense planes; forward and backward run dense cuBLAS GEMMs. For early training, when
//     activations are not sparse yet and the sparse path would be slower.
// Either size depends on M and the compact form's capacity alone, so it can live in
// framework-allocated tensors and a step can be captured in a CUDA graph, and no capacity anywhere
// can drop data. saved_shape(M) says which form, and which capacity, the plan wants for the next
// step (TrainingOptions::dispatch, min_capacity).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "twell/ffn.hpp"
#include "twell/format.hpp"

namespace twell {

// The two forms of the saved state (TrainingPlan::saved_shape): compact (TwELL slots, no backup
// rows; heavy rows routed and recomputed in backward) or dense (every row in the backup planes).
enum class SavedForm : uint8_t { compact, dense };

// Which calls a workspace serves (TrainingPlan::workspace_bytes): both, or forward or backward
// alone (a caller that allocates the scratch per call needs no more than that call's).
enum class TrainingCall : uint8_t { both, forward, backward };

struct TrainingOptions {
  int32_t tile = 0;       // 0 = backend default
  // Slots per (row, tile) of the compact form: 0 = tile / 16 (inference's default is tile / 8).
  int32_t capacity = 0;
  // The smallest capacity a compact state may be sized to. Under automatic dispatch on CUDA,
  // saved_shape(M) sizes each step's compact state to the density the last forward measured:
  // the smallest of capacity, capacity / 2, capacity / 4, ... (none below min_capacity) that
  // holds 16x a tile's mean entries, and one step larger after a forward at a capacity routed
  // more than M / 256 rows (a step lower again after 100 forwards at it that did not). A routed
  // row stays exact: the choice moves memory and time, never results. 0 = min(capacity, max(4,
  // tile / 64)) when capacity is 0, else capacity (a capacity given is kept unless a
  // min_capacity is given too). force_sparse (a fixed size, as a compiled graph needs),
  // force_dense and the CPU backend always keep one capacity.
  int32_t min_capacity = 0;
  double l1_coef = 0.0;   // finite and >= 0 (Error otherwise)
  // Determinism (ffn.hpp). fast on CUDA also routes rows of more than N / 44 entries (at least
  // 96, at most 512): cuBLAS computes them faster than the compact-row kernels; deterministic
  // routes only rows over a tile's capacity.
  Determinism determinism = Determinism::fast;
  // Which saved form saved_shape(M) asks for. automatic (CUDA): compact before any measurement;
  // dense while the density the last finished forward measured (polled, never waited for) is
  // above dense_above; below it, per regime (M to a power of two, density to a factor of ~1.4),
  // each form for three timed steps (a forward and the backward of the same saved buffer), then the
  // faster. force_sparse / force_dense: always compact / dense. The CPU backend always uses the
  // compact form.
  Dispatch dispatch = Dispatch::automatic;
  double dense_above = -1.0;  // <0: backend default (CUDA 0.04)
  GateKernel gate = GateKernel::automatic;  // the compact forward's gate GEMM + pack (ffn.hpp)
  // What identifies the writer of a saved state (its header's owner tag, with the kind and K):
  // 0 (the default) = this plan alone (a number no other plan of the process gets), so backward
  // refuses the state another plan's forward wrote, whatever its shape. A caller that may remake
  // the plan of one layer between a forward and its backward (a plan cache) gives the plans it
  // makes the same nonzero tag: they then accept each other's states of their shape.
  uint64_t state_tag = 0;
};

// workspace (forward and backward, optional): uint8 [>= TrainingPlan::workspace_bytes(M, form of
// the saved state, this call)] on x's device, 16-byte aligned. Without one the plan grows its own
// (outside CUDA-graph capture only); with one the caller's allocator owns the scratch, e.g. a
// framework's, as graph capture of a training step needs.
struct TrainingForwardArgs {
  TensorView x;       // [M, K]
  TensorView y;       // [M, K], written
  TensorView stats;   // optional f32 [2] on x's device: {L0, L1 value (unscaled by l1_coef)}
  TensorView workspace;
};

struct TrainingBackwardArgs {
  TensorView dy;      // [M, K]
  TensorView dx;      // [M, K], written
  TensorView dgate;   // [N, K] f32, written (gated only)
  TensorView dup;     // [N, K] f32, written
  TensorView ddown;   // [N, K] f32, written (neuron-major like the weight)
  // Optional f32 [1] on x's device, instead of options.l1_coef: this call's upstream gradient of
  // the L1 value (l1_coef * d loss / d l1_loss, what frameworks pass, so loss scaling and
  // accumulation stay exact), read where the op runs (no host synchronisation). As a gradient it
  // may have any sign, and a NaN or infinite value makes gradients non-finite as dense autograd
  // does, so that a loss scaler skips the step. CPU: the plan reads it; the gradients are
  // non-finite exactly where dense's are, NaN where dense's are NaN. CUDA: the value stays on the
  // device, unchecked; the dense saved form gives dense's pattern, the compact form only the
  // non-finite gradients of the active units (a gated FFN's dup and dx, which dense also makes
  // NaN through the inactive units, stay finite there).
  TensorView l1_coef;
  TensorView workspace;
};

// Owning convenience holder of the saved state (and a view of x, which the caller keeps alive).
class SavedActivations {
 public:
  SavedActivations();
  ~SavedActivations();
  SavedActivations(SavedActivations&&) noexcept;
  SavedActivations& operator=(SavedActivations&&) noexcept;
  size_t bytes() const;           // memory held between forward and backward
  int64_t routed_rows() const;    // rows that backward recomputes densely
  class Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

class TrainingPlan {
 public:
  TrainingPlan(const FfnWeights& weights, const TrainingOptions& options = {});
  ~TrainingPlan();
  TrainingPlan(TrainingPlan&&) noexcept;
  TrainingPlan& operator=(TrainingPlan&&) noexcept;

  // The saved state for M rows: its shape (backup_capacity 0: compact; M: dense) and dtype;
  // allocate saved_shape(M).bytes(saved_dtype()) bytes on x's device and carve it with
  // make_twell_view. Ask again before each step: under automatic dispatch the form follows the
  // measured density. forward and backward accept either form (CPU: compact only).
  TwellShape saved_shape(int64_t rows) const;
  // The shape of one form, whatever dispatch would ask, the compact one at options().capacity.
  TwellShape saved_shape(int64_t rows, SavedForm form) const;
  // Every shape a saved state of M rows may have under this plan: the compact form at each
  // capacity from options().capacity down to options().min_capacity by halves, then the dense
  // form where the backend runs it (M > 0). A caller that kept only the saved bytes takes the
  // first of them with that size: saved_shape(M) is always that one (at a few rows two
  // capacities can take the same 16-byte-aligned bytes; it then gives the larger).
  std::vector<TwellShape> saved_shapes(int64_t rows) const;
  DType saved_dtype() const;
  // Scratch bytes one forward or backward of M rows needs in a caller workspace (0: none needed),
  // whichever saved form it runs: enough for every form dispatch may ask for.
  size_t workspace_bytes(int64_t rows) const;
  // The same for a step whose saved state has this form, for both its calls or one of them: a
  // caller that allocates the scratch per call (a framework's allocator) needs no more. On CUDA the
  // dense form's backward includes a copy of [Wg; Wu] unless Wu follows Wg in memory (a fused
  // gate-up parameter): ask again after set_weights.
  size_t workspace_bytes(int64_t rows, SavedForm form, TrainingCall call = TrainingCall::both) const;
  // Points the plan at other weight memory of the same kind, shapes, dtype and device (Error
  // otherwise), e.g. a neuron-major down weight a framework makes anew each step. Host-only: safe
  // between the calls of a CUDA-graph capture.
  void set_weights(const FfnWeights& weights);

  // Caller-owned state. Weights may be updated in place between steps; the plan keeps views only.
  void forward(const TrainingForwardArgs& args, const TwellView& saved, Stream stream = nullptr);
  void backward(const TrainingBackwardArgs& args, const TensorView& x, const TwellView& saved,
                Stream stream = nullptr);
  // Plan-allocated state.
  void forward(const TrainingForwardArgs& args, SavedActivations& saved, Stream stream = nullptr);
  void backward(const TrainingBackwardArgs& args, const SavedActivations& saved,
                Stream stream = nullptr);
  const TrainingOptions& options() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell
