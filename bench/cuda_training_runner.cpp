// CUDA training runner: twell's TrainingPlan (caller-owned saved state and workspace) against the
// dense step of training_dense.hpp through cublasGemmEx (16-bit in, fp32 compute, 16-bit or fp32
// out) and the elementwise kernels of training_dense_kernels.cu. CUDA events on a non-blocking
// stream, L2 flushed (a memset of twice its size) before every timed step, as the inference runner.
// Every buffer of a case is allocated in load() and freed in release(); the cuBLAS workspace is the
// runner's own explicit buffer (cublasSetWorkspace), so the memory figures count everything both
// jobs use.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda_rig.hpp"  // testing/
#include "training.hpp"
#include "training_dense.hpp"
#include "training_dense_cuda.hpp"
#include "twell/twell.hpp"

namespace twell::bench {
namespace {

using testing::check;
using testing::CudaRig;
using testing::DeviceBuffer;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::f32: return CUDA_R_32F;
    default: throw Error("bench training", "GEMM dtype", "bfloat16, float16 or float32", dtype_name(t));
  }
}

class CudaTrainingRunner final : public TrainingRunner {
 public:
  CudaTrainingRunner() = default;
  ~CudaTrainingRunner() override { release(); }

  std::string device() const override { return rig_.name; }
  std::string backend() const override { return "cuda"; }

  void load(const testing::Problem& p, const std::vector<uint8_t>& dy, double l1_coef) override {
    release();
    s_ = p.spec;
    if (s_.kind != FfnKind::gated || (s_.dtype != DType::bf16 && s_.dtype != DType::f16))
      throw Error("bench CUDA training", "problem", "gated bfloat16 or float16", s_.describe());
    const size_t m = size_t(s_.m), k = size_t(s_.k), n = size_t(s_.n), es = dtype_size(s_.dtype);
    if (m == 0) throw Error("bench CUDA training", "M", ">= 1", "0");
    if (p.x.size() != m * k * es || dy.size() != m * k * es || p.gate.size() != n * k * es ||
        p.up.size() != n * k * es || p.down.size() != n * k * es)
      throw Error("bench CUDA training", "problem buffers", "sizes of the spec", s_.describe());
    l1_coef_ = l1_coef;
    const Device dev = Device::cuda(0);

    // Shared by both jobs: weights (W1 = [Wg; Wu] in one buffer, which twell's plan views as two
    // [N, K] halves), inputs, outputs (dW1 = [dWg; dWu] likewise).
    w1_.alloc(2 * n * k * es);
    wd_.alloc(n * k * es);
    check(cudaMemcpy(w1_.p, p.gate.data(), n * k * es, cudaMemcpyHostToDevice), "upload Wg");
    check(cudaMemcpy(w1_.at(n * k * es), p.up.data(), n * k * es, cudaMemcpyHostToDevice), "upload Wu");
    check(cudaMemcpy(wd_.p, p.down.data(), n * k * es, cudaMemcpyHostToDevice), "upload Wd");

    // twell: the plan (its saved state and workspace follow).
    FfnWeights w;
    w.kind = FfnKind::gated;
    w.gate = TensorView::matrix(w1_.p, s_.dtype, s_.n, s_.k, dev);
    w.up = TensorView::matrix(w1_.at(n * k * es), s_.dtype, s_.n, s_.k, dev);
    w.down = TensorView::matrix(wd_.p, s_.dtype, s_.n, s_.k, dev);
    TrainingOptions o;
    o.dispatch = dispatch_;
    o.l1_coef = l1_coef;
    plan_ = std::make_unique<TrainingPlan>(w, o);

    // What the rest of the case allocates, at most: a case the device cannot hold is skipped, not
    // failed (the dense form's saved planes counted on top of the compact form's, in case automatic
    // dispatch moves to it).
    const size_t mn = m * n * es;
    const size_t need = 4 * m * k * es + 3 * n * k * sizeof(float) + plan_->workspace_bytes(s_.m) +
                        plan_->saved_shape(s_.m).bytes(plan_->saved_dtype()) + 2 * mn + 5 * mn +
                        (size_t(64) << 20);
    size_t free_bytes = 0, total_bytes = 0;
    check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    if (need > free_bytes) {
      char why[160];
      std::snprintf(why, sizeof why, "needs up to %.1f GB of device memory, %.1f GB free", need / 1e9,
                    free_bytes / 1e9);
      throw SkipCase(why);  // run_training releases the weights and plan
    }

    x_.alloc(m * k * es);
    dy_.alloc(m * k * es);
    y_.alloc(m * k * es);
    dx_.alloc(m * k * es);
    dw1_.alloc(2 * n * k * sizeof(float));
    dwd_.alloc(n * k * sizeof(float));
    stats_.alloc(2 * sizeof(float));
    dense_stats_.alloc(sizeof(DenseForwardStats));
    check(cudaMemcpy(x_.p, p.x.data(), p.x.size(), cudaMemcpyHostToDevice), "upload x");
    check(cudaMemcpy(dy_.p, dy.data(), dy.size(), cudaMemcpyHostToDevice), "upload dy");
    follow_saved_form();

    // Dense: [G | U] (saved), [dh -> dg | du] and h.
    gu_.alloc(2 * m * n * es);
    d_.alloc(2 * m * n * es);
    h_.alloc(m * n * es);
    DenseStepBuffers b;
    b.m = s_.m, b.k = s_.k, b.n = s_.n, b.dtype = s_.dtype;
    b.x = x_.p, b.dy = dy_.p, b.w1 = w1_.p, b.wd = wd_.p;
    b.y = y_.p, b.dx = dx_.p, b.dw1 = dw1_.p, b.dwd = dwd_.p;
    b.gu = gu_.p, b.d = d_.p, b.h = h_.p;
    // dense_gemm checks every shape, leading dimension and buffer size on the host, here once.
    for (DenseGemm g : {DenseGemm::gate_up, DenseGemm::down, DenseGemm::dh, DenseGemm::dx, DenseGemm::dw1,
                        DenseGemm::dwd})
      gemms_[int(g)] = dense_gemm(g, b);
    check(cudaDeviceSynchronize(), "load");
  }

  void release() override {
    plan_.reset();
    for (DeviceBuffer* b : {&x_, &dy_, &w1_, &wd_, &y_, &dx_, &dw1_, &dwd_, &stats_, &saved_, &workspace_,
                            &gu_, &d_, &h_, &dense_stats_})
      b->reset();
  }

  void warm(TrainJob j) override {  // after an L2 flush, as every timed step (inference runner)
    if (j == TrainJob::twell) follow_saved_form();
    rig_.flush();
    step(j);
    check(cudaStreamSynchronize(stream_), "warm-up");
  }

  double time_once(TrainJob j) override {
    if (j == TrainJob::twell) follow_saved_form();
    return rig_.time([&] { step(j); });
  }

  TrainingOutputs run_once(TrainJob j) override {
    if (j == TrainJob::twell) follow_saved_form();
    for (DeviceBuffer* b : {&y_, &dx_, &dw1_, &dwd_, &stats_})  // NaN in every float type
      check(cudaMemsetAsync(b->p, 0xff, b->bytes, stream_), "poison outputs");
    step(j);
    check(cudaStreamSynchronize(stream_), "training step");
    const size_t nk = size_t(s_.n * s_.k);
    TrainingOutputs o;
    o.y.resize(y_.bytes);
    o.dx.resize(dx_.bytes);
    o.dgate.resize(nk);
    o.dup.resize(nk);
    o.ddown.resize(nk);
    check(cudaMemcpy(o.y.data(), y_.p, y_.bytes, cudaMemcpyDeviceToHost), "download y");
    check(cudaMemcpy(o.dx.data(), dx_.p, dx_.bytes, cudaMemcpyDeviceToHost), "download dx");
    check(cudaMemcpy(o.dgate.data(), dw1_.p, nk * sizeof(float), cudaMemcpyDeviceToHost), "download dWg");
    check(cudaMemcpy(o.dup.data(), dw1_.at(nk * sizeof(float)), nk * sizeof(float), cudaMemcpyDeviceToHost),
          "download dWu");
    check(cudaMemcpy(o.ddown.data(), dwd_.p, nk * sizeof(float), cudaMemcpyDeviceToHost), "download dWd");
    if (j == TrainJob::twell) {
      check(cudaMemcpy(o.stats, stats_.p, sizeof o.stats, cudaMemcpyDeviceToHost), "download stats");
      int32_t routed = 0;
      check(cudaMemcpy(&routed, view_.num_routed, sizeof routed, cudaMemcpyDeviceToHost), "download num_routed");
      o.routed_rows = routed;
    }
    return o;
  }

  bool twell_dense() const override { return view_.shape.backup_capacity > 0; }

  TrainingMemory memory(TrainJob j) const override {
    return j == TrainJob::dense ? dense_training_memory(s_, rig_.blas_workspace.bytes)
                                : twell_training_memory(s_, saved_.bytes, workspace_.bytes);
  }

 private:
  void gemm(DenseGemm which) {
    const ColMajorGemm& g = gemms_[int(which)];
    const float alpha = 1.0f, beta = 0.0f;
    check(cublasGemmEx(rig_.blas, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                       g.m, g.n, g.k, &alpha, g.a, cuda_type(g.a_type), g.lda, g.b, cuda_type(g.b_type), g.ldb,
                       &beta, g.c, cuda_type(g.c_type), g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  }

  // As a framework does before each step: allocate the saved form the plan asks for (automatic
  // dispatch: each form for three timed steps per regime, then the faster; dense above its
  // threshold; the compact form's capacity sized to the density), and the workspace that form
  // needs (one buffer: forward and backward in turn). Outside the timed region; settles during
  // warm-up.
  void follow_saved_form() {
    const TwellShape shape = plan_->saved_shape(s_.m);
    if (saved_.p != nullptr && shape.backup_capacity == view_.shape.backup_capacity &&
        shape.capacity == view_.shape.capacity)
      return;
    saved_.reset();
    saved_.alloc(shape.bytes(plan_->saved_dtype()));
    view_ = make_twell_view(saved_.p, shape, plan_->saved_dtype(), Device::cuda(0));
    workspace_.alloc(plan_->workspace_bytes(s_.m, shape.backup_capacity > 0 ? SavedForm::dense : SavedForm::compact));
  }

  void step(TrainJob j) {
    const Device dev = Device::cuda(0);
    const DType t = s_.dtype;
    if (j == TrainJob::twell) {
      TrainingForwardArgs f;
      f.x = TensorView::matrix(x_.p, t, s_.m, s_.k, dev);
      f.y = TensorView::matrix(y_.p, t, s_.m, s_.k, dev);
      f.stats = TensorView::vector(stats_.p, DType::f32, 2, dev);
      if (workspace_.bytes)
        f.workspace = TensorView::vector(workspace_.p, DType::u8, int64_t(workspace_.bytes), dev);
      plan_->forward(f, view_, stream_);
      TrainingBackwardArgs b;
      b.dy = TensorView::matrix(dy_.p, t, s_.m, s_.k, dev);
      b.dx = TensorView::matrix(dx_.p, t, s_.m, s_.k, dev);
      b.dgate = TensorView::matrix(dw1_.p, DType::f32, s_.n, s_.k, dev);
      b.dup = TensorView::matrix(dw1_.at(size_t(s_.n * s_.k) * sizeof(float)), DType::f32, s_.n, s_.k, dev);
      b.ddown = TensorView::matrix(dwd_.p, DType::f32, s_.n, s_.k, dev);
      b.workspace = f.workspace;
      plan_->backward(b, f.x, view_, stream_);
      return;
    }
    const float l1m = float(l1_coef_ / double(s_.m));
    gemm(DenseGemm::gate_up);
    launch_dense_forward_elementwise(gu_.p, h_.p, s_.m, s_.n, static_cast<DenseForwardStats*>(dense_stats_.p),
                                     t, stream_);
    gemm(DenseGemm::down);
    gemm(DenseGemm::dh);
    launch_dense_backward_elementwise(d_.p, h_.p, gu_.p, s_.m, s_.n, l1m, t, stream_);
    gemm(DenseGemm::dx);
    gemm(DenseGemm::dw1);
    gemm(DenseGemm::dwd);
  }

  CudaRig rig_;
  cudaStream_t stream_ = rig_.stream;
  testing::ProblemSpec s_;
  double l1_coef_ = 0;
  DeviceBuffer x_, dy_, w1_, wd_, y_, dx_, dw1_, dwd_, stats_, saved_, workspace_, gu_, d_, h_, dense_stats_;
  std::unique_ptr<TrainingPlan> plan_;
  TwellView view_;
  ColMajorGemm gemms_[6];
};

}  // namespace

std::unique_ptr<TrainingRunner> make_cuda_training_runner() { return std::make_unique<CudaTrainingRunner>(); }

}  // namespace twell::bench
