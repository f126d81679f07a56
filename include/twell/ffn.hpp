// Feed-forward layers and the inference plan.
//
//   gated: h = relu(x Wg^T) * (x Wu^T);  y = h Wd
//   plain: h = relu(x Wu^T);             y = h Wd
// Layouts (row-major, checked):  x, y [M, K];  Wg, Wu [N, K] (nn.Linear's weight);
//   Wd [N, K] "neuron-major": the transpose of nn.Linear down_proj.weight ([K, N]), so that each
//   active neuron's down row is contiguous.
#pragma once
#include <cstdint>
#include <memory>

#include "twell/error.hpp"
#include "twell/tensor.hpp"

namespace twell {

enum class FfnKind : uint8_t { gated, plain };
const char* ffn_kind_name(FfnKind k);

struct FfnWeights {
  FfnKind kind = FfnKind::gated;
  TensorView gate;  // [N, K]; gated only (must be undefined for plain)
  TensorView up;    // [N, K]
  TensorView down;  // [N, K] neuron-major

  int64_t hidden() const { return up.rank == 2 ? up.shape[1] : 0; }        // K
  int64_t intermediate() const { return up.rank == 2 ? up.shape[0] : 0; }  // N
  // Throws Error naming the first weight whose shape, dtype, device or layout is off.
  void validate(const char* op) const;
};

// Opaque stream: a cudaStream_t for CUDA tensors (nullptr means cudaStreamPerThread, never the
// legacy default stream); ignored for CPU tensors.
using Stream = void*;

enum class Dispatch : uint8_t {
  automatic,     // sparse where the measured density makes it faster, else dense
  force_sparse,  // always the TwELL path (overflowing rows still go to the dense backup)
  force_dense,   // always dense GEMMs
};

// How the CUDA sparse path computes the gate GEMM and the TwELL pack (other backends ignore it).
enum class GateKernel : uint8_t {
  automatic,  // the fused sm_90a kernel (TwELL packed in the GEMM epilogue) on compute capability
              // 9.0 devices of a build with sm_90a; the portable pair elsewhere
  portable,   // cuBLASLt GEMM, then a pack kernel over G that applies the ReLU (any sm_80+ device)
};

// fast (CUDA): the dense products of the backup rows (routed rows, and compact rows of many
// entries) run through cuBLAS for as many rows as the plan learned to expect from its earlier runs
// (the rest, and all of them before anything is learned, on twell's tensor-core kernel), so a
// backup row's rounding can differ between the first runs and later ones (each way exact to the
// dtype's rounding); runs then agree while the counts stay within what was learned. Likewise,
// under automatic dispatch, the most entries of a row one warp computes follows the density
// measured by earlier runs (longer rows: a CTA, summed in another order).
// deterministic: every backup row on the kernel; reruns are bit-identical. Either way no float
// atomics are used. The CPU backend is deterministic in both modes.
enum class Determinism : uint8_t { fast, deterministic };

struct InferenceOptions {
  int32_t tile = 0;             // TwELL tile width; 0 = backend default (CPU 256, CUDA 256)
  int32_t capacity = 0;         // slots per (row, tile); 0 = tile / 8
  Dispatch dispatch = Dispatch::automatic;
  GateKernel gate = GateKernel::automatic;
  double dense_above = -1.0;    // density (fraction of N) above which automatic dispatch runs
                                // dense; <0 = backend default (CPU 0.035, CUDA 0.04). CUDA decides
                                // from what finished runs measured (density, and the time of each
                                // path per regime), so a decision never waits for the device.
  Determinism determinism = Determinism::fast;
};

// counters (optional, int64 [2] on x's device): {rows routed to the dense backup, active entries}.
// Written by the op on its stream, so reading them needs no extra synchronisation inside twell.
struct InferenceArgs {
  TensorView x;         // [M, K]
  TensorView y;         // [M, K], written
  TensorView counters;  // optional int64 [2]
};

// Host-side summary of the last run(). On CUDA only the device knows the routed and active counts:
// they read -1 here (use InferenceArgs::counters, written on the stream); rows and ran_dense are
// exact everywhere.
struct RunInfo {
  int64_t rows = 0;
  int64_t routed_rows = 0;  // rows that went to the dense backup; -1 when unknown on the host
  int64_t active = 0;       // non-zero gate activations over all rows; -1 when unknown on the host
  bool ran_dense = false;   // dispatch chose (or was forced to) the dense path
  double density() const;   // active per row; -1 when unknown
};

// Created once per layer, run many times. Holds weight views (not copies, except where a backend
// needs a converted copy; see docs), capacities and a workspace that grows on demand.
// CUDA: tiles of 64, 128 or 256; K and N multiples of 8; bf16 or fp16. run() is CUDA-graph
// capturable once the plan's workspace is large enough (one uncaptured run at that M first) or
// when the caller passes a workspace; a captured graph stays valid while that workspace lives.
class InferencePlan {
 public:
  InferencePlan(const FfnWeights& weights, const InferenceOptions& options = {});
  ~InferencePlan();
  InferencePlan(InferencePlan&&) noexcept;
  InferencePlan& operator=(InferencePlan&&) noexcept;

  Status can_run(const InferenceArgs& args) const;
  size_t workspace_bytes(const InferenceArgs& args) const;
  // The same for a run of `rows` rows (Error naming "rows" when negative).
  size_t workspace_bytes(int64_t rows) const;
  // workspace: optional caller memory on x's device of at least workspace_bytes(args) bytes, at
  // a 16-byte aligned address; when null the plan uses (and grows) its own.
  void run(const InferenceArgs& args, Stream stream = nullptr, void* workspace = nullptr,
           size_t workspace_size = 0);
  RunInfo last_run() const;
  const FfnWeights& weights() const;
  const InferenceOptions& options() const;  // with defaults resolved
  // Points the plan at other weight memory of the same kind, shapes, dtype and device (Error
  // otherwise), e.g. a neuron-major down weight a framework makes anew each call; the dispatch
  // calibration stays. Host-only: safe between the calls of a CUDA-graph capture.
  void set_weights(const FfnWeights& weights);

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The entries of `values` (host memory, float32 / float16 / bfloat16, contiguous, any rank) that
// are not <= 0: positive or NaN, the units a ReLU makes active, counted as the plans count them
// (RunInfo::active). On cpu_threads() threads for large tensors (2^22 values and more). twell.torch counts a gate's
// pre-activations with it where it runs torch's own dense MLP. Error naming "values" for a
// device, dtype or layout other than these.
int64_t count_active(const TensorView& values);

// One-shot convenience: builds a plan and runs it.
void ffn_forward(const FfnWeights& weights, const TensorView& x, const TensorView& y,
                 Stream stream = nullptr, const InferenceOptions& options = {});

}  // namespace twell
