// The CUDA training backend's class, shared by its three files: plan.cpp (the plan, the
// compact-form pipelines), routed.cpp (backward's routed rows) and dense.cpp (the dense form).
// Every step only enqueues work on the caller's stream: no host synchronisation, no allocation but
// the plan's workspace growing outside a capture, so a forward + backward can be captured in a
// CUDA graph. The routed row count exists only on the device; kernels over routed rows read it and
// exit past it. W1 is the gate weight (gated) or the up weight (plain).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "core/backend.hpp"
#include "cuda/kernels/inference.hpp"
#include "cuda/kernels/training.hpp"
#include "cuda/policy/calibration.hpp"
#include "cuda/policy/problem.hpp"
#include "cuda/runtime/blas_gemm.hpp"
#include "cuda/runtime/device.hpp"
#include "cuda/runtime/lt_gemm.hpp"
#include "cuda/runtime/run_order.hpp"
#include "cuda/training/workspace.hpp"

namespace twell::gpu::training {

constexpr const char* kPlanOp = "TrainingPlan";
constexpr const char* kForwardOp = "TrainingPlan::forward";
constexpr const char* kBackwardOp = "TrainingPlan::backward";

template <typename P>
P* at(char* base, size_t offset) {
  return reinterpret_cast<P*>(base + offset);
}

// The weight gradients' and dx's destinations of one backward.
struct Grads {
  void* dx = nullptr;
  float* dfirst = nullptr;  // dW1
  float* dup = nullptr;     // dWu (gated only)
  float* ddown = nullptr;
};

// Backward's routed rows (order[0 .. *count)) and the workspace their dense gradients use.
struct RoutedBuffers {
  const int32_t* order = nullptr;
  const int32_t* count = nullptr;
  char* p = nullptr;
  char* q = nullptr;
  SplitK split_k;
  int64_t chunk_rows = 0;   // rows of p and q: the routed rows go in chunks of this many
  int64_t blas_rows = 0;    // C: rows order[0 .. C) through cuBLAS (at most chunk_rows)
  char* blas = nullptr;     // their x, dy (dtype) and dx (f32) rows, [C, K] each
  void* lt = nullptr;       // cuBLAS(Lt) scratch, LtConfig::kWorkspaceBytes
};

class CudaTraining final : public detail::TrainingBackend {
 public:
  CudaTraining(const FfnWeights& w, const TrainingOptions& o);
  ~CudaTraining() override;

  DType saved_dtype() const override { return dims_.dtype; }
  void set_weights(const FfnWeights& w) override {
    rebound_.rebound(w, "TrainingPlan::set_weights");
    weights_ = w;
  }
  size_t workspace_bytes(int64_t rows, SavedForm form, TrainingCall call) const override;
  bool supports_dense_layout() const override { return options_.dispatch != Dispatch::force_sparse; }
  bool wants_dense_layout(int64_t rows) override;
  int32_t compact_capacity(int64_t rows) override;

  void forward(const TrainingForwardArgs& args, const TwellView& saved, Stream stream) override;
  void backward(const TrainingBackwardArgs& args, const TensorView& x, const TwellView& saved,
                Stream stream) override;

  void seal_saved(const TwellView& saved, const TwellHeader& header, Stream stream) override;
  void check_saved(const TwellView& saved, const TwellHeader& expected, Stream stream) override;
  void raise_reported_fault(const char* op) override;
  std::shared_ptr<void> allocate(size_t bytes) override;
  int64_t routed_rows(const TwellView& saved) override;

 private:
  // The compact form (plan.cpp).
  void forward_compact(const TrainingForwardArgs& args, const TwellView& saved, int64_t rows, char* base,
                       bool capturing, cudaStream_t s);
  void backward_compact(const TrainingBackwardArgs& args, const TensorView& x, const TwellView& saved,
                        const Grads& g, int64_t rows, char* base, const L1Coef& l1, bool capturing,
                        cudaStream_t s);
  // Dense gradients of the routed rows, added to the compact rows' ones (routed.cpp).
  void backward_routed(const void* x, const void* dy, const Grads& g, const RoutedBuffers& b, int64_t rows,
                       const L1Coef& l1, cudaStream_t s);
  // One chunk's kernels, all of them or one part (the first chunk's interleave with cuBLAS's rows).
  enum class ChunkPart : uint8_t { all, hidden, input_grad, weight_grads };
  void routed_chunk(const void* x, const void* dy, const Grads& g, const RoutedBuffers& b, int64_t rows,
                    const L1Coef& l1, RoutedChunk chunk, int64_t first, cudaStream_t s,
                    ChunkPart part = ChunkPart::all);
  // The dense form (saved.shape.backup_capacity == rows): cuBLAS(Lt) GEMMs and elementwise passes
  // (dense.cpp).
  void forward_dense(const TrainingForwardArgs& args, const TwellView& saved, int64_t rows, char* base,
                     cudaStream_t s);
  void backward_dense(const TrainingBackwardArgs& args, const TensorView& x, const TwellView& saved,
                      const Grads& g, int64_t rows, char* base, const L1Coef& l1, cudaStream_t s);
  // The statistics {L0, L1} from the active count and the h rows in `hidden` of the routed rows;
  // partials > 0 (the dense form): from the `partials` sums of |h| already in row_l1.
  void launch_statistics(const TwellView& saved, const void* hidden, const unsigned long long* active,
                         float* row_l1, float* stats, int64_t rows, cudaStream_t s, int64_t partials = 0);

  // The workspace base for a run of `rows` rows on s: the caller's, or the plan's own, ordered
  // after the previous run.
  char* begin(int64_t rows, const TensorView& caller, cudaStream_t s, bool capturing, const char* op);
  // Whether the dense backward copies [Wg; Wu] into the workspace (gated weights where Wu does not
  // follow Wg in memory; a fused gate-up parameter is read in place).
  bool copies_weights() const;
  TrainDenseBackwardLayout dense_backward_layout(int64_t rows) const {
    return train_dense_backward_layout(dims_, rows, copies_weights());
  }
  const void* first_weight() const {
    return dims_.kind == FfnKind::gated ? weights_.gate.data : weights_.up.data;
  }
  // Determinism::fast: compact rows of more entries than this are routed (TrainRowConfig); -1: none.
  int32_t route_above() const;

  FfnWeights weights_;
  ReboundWeights rebound_;
  TrainingOptions options_;
  ProblemDims dims_;
  DeviceInfo device_;
  bool fused_gate_;  // the compact forward packs TwELL in the gate GEMM epilogue (gate_pack.cu)
  std::unique_ptr<LtGemm> lt_;
  std::unique_ptr<BlasGemm> blas_;  // the dense path's weight gradients, the routed rows' share
  // Determinism::fast: the routed rows' first C through cuBLAS, C learned from earlier forwards.
  RoutedCapacity routed_capacity_{kForwardOp, options_.determinism};
  TrainingCalibration calibration_;  // automatic dispatch: timed steps of either saved form
  // Automatic dispatch with min_capacity < capacity: the compact state sized to the density.
  SavedCapacity saved_capacity_{kForwardOp, options_.tile, options_.capacity, options_.min_capacity};
  std::unique_ptr<RunOrder> order_;  // runs across streams; the plan's own workspace
  SavedFault* fault_flag_ = nullptr;    // device: the running saved-state check's first fault
  SavedFault* fault_report_ = nullptr;  // host-mapped: the first fault not yet raised
};

}  // namespace twell::gpu::training
