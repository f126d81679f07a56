// The CUDA training backend. Every step only enqueues work on the caller's stream: no host
// synchronisation, no allocation but the plan's workspace growing outside a capture, so a
// forward + backward can be captured in a CUDA graph. The routed row count exists only on the
// device; kernels over routed rows read it and exit past it.
//   forward:  G = relu(x W1^T) (cuBLASLt) -> TwELL pack into `saved` (plane 0 = g) -> compact rows:
//             u into plane 1, y, per-row L1 -> routed rows: inference's dense backup (y, h in G)
//             -> statistics {L0, L1}
//   backward: routed rows listed in ascending order -> compact rows: dh per entry, dx -> column
//             index -> per-neuron weight gradients (written) -> routed rows recomputed densely from
//             x and dy on tensor cores: g, u, dh -> dg, du, h -> dx rows, weight gradients (added)
// Nothing depends on the order of an atomic or a float reduction across CTAs: both Determinism
// modes give bit-identical results run to run (fast has nothing faster to trade for it yet).
// W1 is the gate weight (gated) or the up weight (plain). docs/kernels.md has the reasoning.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <string>

#include "core/backend.hpp"
#include "cuda/config.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device.hpp"
#include "cuda/kernels.hpp"
#include "cuda/lt_gemm.hpp"
#include "cuda/train_kernels.hpp"
#include "cuda/train_workspace.hpp"
#include "cuda/workspace.hpp"

namespace twell::gpu {

namespace {

constexpr const char* kPlanOp = "TrainingPlan";
constexpr const char* kForwardOp = "TrainingPlan::forward";
constexpr const char* kBackwardOp = "TrainingPlan::backward";

// Throws Error naming `name` unless p is device (or managed) memory usable on `device`; for
// buffers read or written element by element (no vector alignment needed).
void check_device_memory(const void* p, int device, const char* op, const char* name) {
  cudaPointerAttributes a{};
  check_cuda(cudaPointerGetAttributes(&a, p), op, name);
  const std::string want = "device memory on cuda:" + std::to_string(device);
  if (a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost)
    throw Error(op, name, want, "host memory");
  if (a.type == cudaMemoryTypeDevice && a.device != device)
    throw Error(op, name, want, "memory on cuda:" + std::to_string(a.device));
}

void check_saved_memory(const TwellView& v, int device, const char* op) {
  check_device_memory(v.num_routed, device, op, "saved num_routed");
  if (v.shape.rows == 0) return;
  check_device_memory(v.values, device, op, "saved values");
  check_device_memory(v.cols, device, op, "saved cols");
  check_device_memory(v.counts, device, op, "saved counts");
  check_device_memory(v.row_slot, device, op, "saved row_slot");
  check_device_memory(v.routed_rows, device, op, "saved routed_rows");
}

void check_rows(int64_t rows, const char* op) {
  if (rows > std::numeric_limits<int32_t>::max())
    throw Error(op, "x", "at most 2147483647 rows (int32 row indices)", std::to_string(rows));
}

template <typename P>
P* at(char* base, size_t offset) {
  return reinterpret_cast<P*>(base + offset);
}

class CudaTraining final : public detail::TrainingBackend {
 public:
  CudaTraining(const FfnWeights& w, const TrainingOptions& o)
      : weights_(w),
        options_(o),
        dims_(supported_dims(w, o.tile, o.capacity, kPlanOp)),
        device_(query_device(w.up.device.index, kPlanOp)) {
    DeviceGuard guard(device_.index, kPlanOp);
    if (w.kind == FfnKind::gated) check_device_pointer(w.gate.data, device_.index, kPlanOp, "gate weight");
    check_device_pointer(w.up.data, device_.index, kPlanOp, "up weight");
    check_device_pointer(w.down.data, device_.index, kPlanOp, "down weight");
    lt_ = std::make_unique<LtGemm>(dims_.dtype);
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), kPlanOp, "run event");
  }

  ~CudaTraining() override {
    if (done_ != nullptr) cudaEventDestroy(done_);
  }

  DType saved_dtype() const override { return dims_.dtype; }
  void set_weights(const FfnWeights& w) override { weights_ = w; }
  size_t workspace_bytes(int64_t rows) const override {
    return std::max(train_forward_layout(dims_, rows).bytes, train_backward_layout(dims_, rows).bytes);
  }

  void forward(const TrainingForwardArgs& args, const TwellView& saved, Stream stream) override;
  void backward(const TrainingBackwardArgs& args, const TensorView& x, const TwellView& saved,
                Stream stream) override;

  std::shared_ptr<void> allocate(size_t bytes) override {
    DeviceGuard guard(device_.index, kForwardOp);
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), kForwardOp, "saved activations");
    return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  }

  int64_t routed_rows(const TwellView& saved) override {
    const char* op = "SavedActivations::routed_rows";
    DeviceGuard guard(device_.index, op);
    check_cuda(cudaDeviceSynchronize(), op, "device synchronisation");
    int32_t routed = 0;
    check_cuda(cudaMemcpy(&routed, saved.num_routed, sizeof routed, cudaMemcpyDeviceToHost), op,
               "routed row count");
    return routed;
  }

 private:
  // The workspace base for a run of `rows` rows on s: the caller's, or the plan's own, ordered
  // after the previous run.
  char* begin(int64_t rows, const TensorView& caller, cudaStream_t s, bool capturing,
              const char* op) {
    // Runs on different streams share the plan's workspace: order them.
    if (!capturing && last_stream_ != nullptr && last_stream_ != s)
      check_cuda(cudaStreamWaitEvent(s, done_, 0), op, "previous run");
    if (caller.defined()) return aligned_base(caller.data);
    return aligned_base(own_.reserve(workspace_bytes(rows), s, done_, capturing, op));
  }

  void end(cudaStream_t s, bool capturing, const char* op) {
    if (capturing) return;
    check_cuda(cudaEventRecord(done_, s), op, "run event");
    last_stream_ = s;
  }

  const void* first_weight() const {
    return dims_.kind == FfnKind::gated ? weights_.gate.data : weights_.up.data;
  }

  // Dense gradients of the routed rows (order[0 .. *count)), added to the compact rows' ones.
  struct RoutedBuffers {
    const int32_t* order = nullptr;
    const int32_t* count = nullptr;
    char* p = nullptr;
    char* q = nullptr;
  };
  struct Grads {
    void* dx = nullptr;
    float* dfirst = nullptr;
    float* dup = nullptr;
    float* ddown = nullptr;
  };
  void backward_routed(const void* x, const void* dy, const Grads& g, const RoutedBuffers& b,
                       int64_t rows, const L1Coef& l1, cudaStream_t s);

  FfnWeights weights_;
  TrainingOptions options_;
  ProblemDims dims_;
  DeviceInfo device_;
  std::unique_ptr<LtGemm> lt_;
  OwnedWorkspace own_;
  cudaEvent_t done_ = nullptr;          // recorded at the end of every uncaptured run
  cudaStream_t last_stream_ = nullptr;  // the stream of the last uncaptured run
};

void CudaTraining::forward(const TrainingForwardArgs& args, const TwellView& saved, Stream stream) {
  DeviceGuard guard(device_.index, kForwardOp);
  const cudaStream_t s = resolve_stream(stream);
  const bool capturing = is_capturing(s, kForwardOp);
  const int64_t rows = args.x.shape[0];
  check_rows(rows, kForwardOp);
  auto* stats = static_cast<float*>(args.stats.data);
  if (!capturing) {
    if (stats != nullptr) check_device_memory(stats, device_.index, kForwardOp, "stats");
    check_saved_memory(saved, device_.index, kForwardOp);
    if (rows > 0) {
      check_device_pointer(args.x.data, device_.index, kForwardOp, "x");
      check_device_pointer(args.y.data, device_.index, kForwardOp, "y");
    }
  }
  check_cuda(cudaMemsetAsync(saved.num_routed, 0, sizeof(int32_t), s), kForwardOp, "saved num_routed");
  if (rows == 0) {
    if (stats != nullptr) check_cuda(cudaMemsetAsync(stats, 0, 2 * sizeof(float), s), kForwardOp, "stats");
    return;
  }

  char* base = begin(rows, args.workspace, s, capturing, kForwardOp);
  const TrainForwardLayout l = train_forward_layout(dims_, rows);
  auto* active = at<unsigned long long>(base, l.active);
  void* hidden = base + l.hidden;
  float* row_l1 = stats != nullptr ? at<float>(base, l.row_l1) : nullptr;
  check_cuda(cudaMemsetAsync(active, 0, sizeof *active, s), kForwardOp, "activation count");

  GemmCall gate;
  gate.id = GemmId::gate;
  gate.act = Activation::relu;
  gate.layout = WeightLayout::n_by_k;
  gate.m = rows;
  gate.n = dims_.n;
  gate.k = dims_.k;
  gate.a = args.x.data;
  gate.b = first_weight();
  gate.d = hidden;
  lt_->run(gate, s, base + l.lt);

  PackArgs pack;
  pack.hidden = hidden;
  pack.out = saved;
  pack.active = active;
  launch_pack(pack, device_, s);

  ForwardRowsArgs compact;
  compact.kind = dims_.kind;
  compact.x = args.x.data;
  compact.up = weights_.up.data;
  compact.down = weights_.down.data;
  compact.y = args.y.data;
  compact.row_l1 = row_l1;
  compact.k = dims_.k;
  compact.saved = saved;
  launch_forward_rows(compact, s);

  const RoutedArgs routed = routed_args(dims_, weights_, args.x.data, args.y.data, hidden, rows,
                                        saved.routed_rows, saved.num_routed);
  launch_routed(routed, device_, s);
  launch_routed_renumber(saved, s);

  if (stats != nullptr) {
    StatsArgs st;
    st.dtype = dims_.dtype;
    st.hidden = hidden;
    st.n = dims_.n;
    st.rows = rows;
    st.routed_rows = saved.routed_rows;
    st.num_routed = saved.num_routed;
    st.active = active;
    st.row_l1 = row_l1;
    st.stats = stats;
    launch_stats(st, device_, s);
  }
  end(s, capturing, kForwardOp);
}

void CudaTraining::backward(const TrainingBackwardArgs& args, const TensorView& x,
                            const TwellView& saved, Stream stream) {
  DeviceGuard guard(device_.index, kBackwardOp);
  const cudaStream_t s = resolve_stream(stream);
  const bool capturing = is_capturing(s, kBackwardOp);
  const int64_t rows = x.shape[0];
  check_rows(rows, kBackwardOp);
  const bool gated = dims_.kind == FfnKind::gated;
  Grads g;
  g.dx = args.dx.data;
  g.dfirst = static_cast<float*>(gated ? args.dgate.data : args.dup.data);
  g.dup = gated ? static_cast<float*>(args.dup.data) : nullptr;
  g.ddown = static_cast<float*>(args.ddown.data);
  const auto* l1_device = static_cast<const float*>(args.l1_coef.data);
  if (!capturing) {
    if (gated) check_device_pointer(args.dgate.data, device_.index, kBackwardOp, "dgate");
    check_device_pointer(args.dup.data, device_.index, kBackwardOp, "dup");
    check_device_pointer(args.ddown.data, device_.index, kBackwardOp, "ddown");
    if (l1_device != nullptr) check_device_memory(l1_device, device_.index, kBackwardOp, "l1_coef");
    check_saved_memory(saved, device_.index, kBackwardOp);
    if (rows > 0) {
      check_device_pointer(x.data, device_.index, kBackwardOp, "x");
      check_device_pointer(args.dy.data, device_.index, kBackwardOp, "dy");
      check_device_pointer(args.dx.data, device_.index, kBackwardOp, "dx");
    }
  }
  if (rows == 0) {
    const size_t bytes = size_t(dims_.n * dims_.k) * sizeof(float);
    for (float* d : {g.dfirst, g.dup, g.ddown})
      if (d != nullptr) check_cuda(cudaMemsetAsync(d, 0, bytes, s), kBackwardOp, "weight gradients");
    return;
  }

  char* base = begin(rows, args.workspace, s, capturing, kBackwardOp);
  const TrainBackwardLayout l = train_backward_layout(dims_, rows);
  RoutedBuffers rb;
  auto* order = at<int32_t>(base, l.order);
  auto* count = at<int32_t>(base, l.count);
  rb.order = order;
  rb.count = count;
  rb.p = base + l.p;
  rb.q = base + l.q;
  auto* dh = at<float>(base, l.dh);
  const L1Coef l1{l1_device, float(options_.l1_coef)};

  launch_routed_order(saved.row_slot, rows, order, count, s);

  BackwardRowsArgs compact;
  compact.kind = dims_.kind;
  compact.dy = args.dy.data;
  compact.first = first_weight();
  compact.up = weights_.up.data;
  compact.down = weights_.down.data;
  compact.dx = args.dx.data;
  compact.dh = dh;
  compact.l1 = l1;
  compact.k = dims_.k;
  compact.saved = saved;
  launch_backward_rows(compact, s);

  ColumnIndexArgs index;
  index.saved = saved;
  index.block_counts = at<int32_t>(base, l.block_counts);
  index.col_totals = at<int32_t>(base, l.col_totals);
  index.col_ptr = at<int64_t>(base, l.col_ptr);
  index.entries = at<int64_t>(base, l.entries);
  launch_column_index(index, s);

  WeightGradArgs wg;
  wg.kind = dims_.kind;
  wg.dtype = dims_.dtype;
  wg.x = x.data;
  wg.dy = args.dy.data;
  wg.dh = dh;
  wg.col_ptr = index.col_ptr;
  wg.entries = index.entries;
  wg.dfirst = g.dfirst;
  wg.dup = g.dup;
  wg.ddown = g.ddown;
  wg.k = dims_.k;
  wg.saved = saved;
  launch_weight_grads(wg, s);

  backward_routed(x.data, args.dy.data, g, rb, rows, l1, s);
  end(s, capturing, kBackwardOp);
}

void CudaTraining::backward_routed(const void* x, const void* dy, const Grads& g,
                                   const RoutedBuffers& b, int64_t rows, const L1Coef& l1,
                                   cudaStream_t s) {
  const bool gated = dims_.kind == FfnKind::gated;
  const int64_t n = dims_.n, k = dims_.k;
  const int64_t q_cols = gated ? 2 * n : n;
  char* q_second = b.q + size_t(n) * dtype_size(dims_.dtype);  // gated: columns N .. 2N-1 of q

  // g = relu(x W1^T) -> p;  gated: u = x Wu^T -> q[:, :N];  dh = dy Wd^T -> q[:, N:] (plain: q)
  RecomputeArgs r;
  r.dtype = dims_.dtype;
  r.n_out = n;
  r.k = k;
  r.max_rows = rows;
  r.order = b.order;
  r.count = b.count;
  r.act = Activation::relu;
  r.src = x;
  r.weight = first_weight();
  r.out = b.p;
  r.ldo = n;
  launch_routed_recompute(r, device_, s);
  r.act = Activation::none;
  r.ldo = q_cols;
  if (gated) {
    r.weight = weights_.up.data;
    r.out = b.q;
    launch_routed_recompute(r, device_, s);
  }
  r.src = dy;
  r.weight = weights_.down.data;
  r.out = gated ? q_second : b.q;
  launch_routed_recompute(r, device_, s);

  RoutedHiddenArgs h;
  h.kind = dims_.kind;
  h.dtype = dims_.dtype;
  h.p = b.p;
  h.q = b.q;
  h.n = n;
  h.rows = rows;
  h.l1 = l1;
  h.count = b.count;
  launch_routed_hidden(h, device_, s);

  // dx rows = [dg | du] [W1; Wu]  (plain: dg W1)
  InputGradArgs in;
  in.dtype = dims_.dtype;
  in.grad = b.q;
  in.first = first_weight();
  in.second = gated ? weights_.up.data : nullptr;
  in.depth = q_cols;
  in.split = n;
  in.dx = g.dx;
  in.k = k;
  in.max_rows = rows;
  in.order = b.order;
  in.count = b.count;
  launch_routed_input_grad(in, device_, s);

  // dW1 += dg^T x;  gated: dWu += du^T x;  dWd += h^T dy
  WeightGradGemmArgs w;
  w.dtype = dims_.dtype;
  w.n = n;
  w.k = k;
  w.order = b.order;
  w.count = b.count;
  w.grad = b.q;
  w.lda = q_cols;
  w.src = x;
  w.dw = g.dfirst;
  launch_routed_weight_grad(w, device_, s);
  if (gated) {
    w.grad = q_second;
    w.dw = g.dup;
    launch_routed_weight_grad(w, device_, s);
  }
  w.grad = b.p;
  w.lda = n;
  w.src = dy;
  w.dw = g.ddown;
  launch_routed_weight_grad(w, device_, s);
}

}  // namespace

}  // namespace twell::gpu

namespace twell::detail {

std::unique_ptr<TrainingBackend> make_cuda_training(const FfnWeights& w, const TrainingOptions& o) {
  return std::make_unique<gpu::CudaTraining>(w, o);
}

}  // namespace twell::detail
