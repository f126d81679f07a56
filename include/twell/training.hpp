// Training: forward that saves the compact hybrid layout, and an exact backward with the L1 term.
//
// L1 normalisation (the paper's): l1_value = (1/M) * sum_m sum_n |h[m, n]|, i.e. the per-token sum
// of |h| averaged over tokens; the loss term is l1_coef * l1_value and its gradient w.r.t. h is
// l1_coef * sign(h) / M. L0 = (1/M) * #{(m, n): gate active}, the mean active neurons per token.
#pragma once
#include <cstdint>
#include <memory>

#include "twell/ffn.hpp"
#include "twell/format.hpp"

namespace twell {

enum class Determinism : uint8_t { fast, deterministic };

struct TrainingOptions {
  int32_t tile = 0;       // 0 = backend default
  int32_t capacity = 0;   // 0 = tile / 8
  double l1_coef = 0.0;
  Determinism determinism = Determinism::deterministic;
};

// What forward keeps for backward: a view of x (the caller keeps it alive) and the hybrid layout of
// the hidden activations (gated: planes {relu(gate), up}; plain: plane {h}) on x's device.
class SavedActivations {
 public:
  SavedActivations();
  ~SavedActivations();
  SavedActivations(SavedActivations&&) noexcept;
  SavedActivations& operator=(SavedActivations&&) noexcept;
  size_t bytes() const;           // memory held between forward and backward
  int64_t routed_rows() const;    // host count (CPU) / after synchronisation (CUDA)
  class Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

struct TrainingForwardArgs {
  TensorView x;       // [M, K]
  TensorView y;       // [M, K], written
  TensorView stats;   // optional f32 [2] on x's device: {L0, L1 value (unscaled by l1_coef)}
};

struct TrainingBackwardArgs {
  TensorView dy;      // [M, K]
  TensorView dx;      // [M, K], written
  TensorView dgate;   // [N, K] f32, written (gated only)
  TensorView dup;     // [N, K] f32, written
  TensorView ddown;   // [N, K] f32, written (neuron-major like the weight)
};

class TrainingPlan {
 public:
  TrainingPlan(const FfnWeights& weights, const TrainingOptions& options = {});
  ~TrainingPlan();
  TrainingPlan(TrainingPlan&&) noexcept;
  TrainingPlan& operator=(TrainingPlan&&) noexcept;

  // Weights may be updated in place between steps; the plan keeps views only.
  void forward(const TrainingForwardArgs& args, SavedActivations& saved, Stream stream = nullptr);
  void backward(const TrainingBackwardArgs& args, const SavedActivations& saved,
                Stream stream = nullptr);
  const TrainingOptions& options() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell
