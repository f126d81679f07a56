// CPU training runner (float32 only): twell's CPU TrainingPlan against the dense step of
// training_dense.hpp, whose GEMMs run as the very column-major calls the CUDA runner hands to
// cuBLAS, here through cblas_sgemm(CblasColMajor, ...). Wall-clock (steady_clock) timings.
// Memory figures count the buffers below; the CPU plan's own host scratch (it needs no caller
// workspace) is not in them.
#include <cblas.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "training.hpp"
#include "training_dense.hpp"
#include "twell/info.hpp"
#include "twell/twell.hpp"

namespace twell::bench {
namespace {

void run_gemm(const ColMajorGemm& g) {
  if (g.a_type != DType::f32 || g.b_type != DType::f32 || g.c_type != DType::f32)
    throw Error("bench CPU training", "GEMM types", "float32", dtype_name(g.a_type));
  cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
              g.m, g.n, g.k, 1.0f, static_cast<const float*>(g.a), g.lda, static_cast<const float*>(g.b),
              g.ldb, 0.0f, static_cast<float*>(g.c), g.ldc);
}

class CpuTrainingRunner final : public TrainingRunner {
 public:
  std::string device() const override { return "cpu: " + cpu_description(); }
  std::string backend() const override { return "cpu"; }

  void load(const testing::Problem& p, const std::vector<uint8_t>& dy, double l1_coef) override {
    release();
    s_ = p.spec;
    if (s_.kind != FfnKind::gated || s_.dtype != DType::f32)
      throw Error("bench CPU training", "problem", "gated float32", s_.describe());
    const size_t m = size_t(s_.m), k = size_t(s_.k), n = size_t(s_.n);
    if (p.x.size() != m * k * 4 || dy.size() != m * k * 4 || p.gate.size() != n * k * 4 ||
        p.up.size() != n * k * 4 || p.down.size() != n * k * 4)
      throw Error("bench CPU training", "problem buffers", "sizes of the spec", s_.describe());
    l1_coef_ = l1_coef;
    auto floats = [](const std::vector<uint8_t>& b) {
      std::vector<float> v(b.size() / 4);
      std::memcpy(v.data(), b.data(), b.size());
      return v;
    };
    x_ = floats(p.x);
    dy_ = floats(dy);
    w1_.resize(2 * n * k);  // [Wg; Wu]
    std::memcpy(w1_.data(), p.gate.data(), n * k * 4);
    std::memcpy(w1_.data() + n * k, p.up.data(), n * k * 4);
    wd_ = floats(p.down);
    y_.resize(m * k);
    dx_.resize(m * k);
    dw1_.resize(2 * n * k);
    dwd_.resize(n * k);
    stats_.resize(2);
    gu_.resize(2 * m * n);
    d_.resize(2 * m * n);
    h_.resize(m * n);

    const Device cpu = Device::cpu();
    FfnWeights w;
    w.kind = FfnKind::gated;
    w.gate = TensorView::matrix(w1_.data(), DType::f32, s_.n, s_.k, cpu);
    w.up = TensorView::matrix(w1_.data() + n * k, DType::f32, s_.n, s_.k, cpu);
    w.down = TensorView::matrix(wd_.data(), DType::f32, s_.n, s_.k, cpu);
    TrainingOptions o;
    o.dispatch = dispatch_;
    o.l1_coef = l1_coef;
    plan_ = std::make_unique<TrainingPlan>(w, o);
    const TwellShape shape = plan_->saved_shape(s_.m);
    saved_bytes_ = shape.bytes(plan_->saved_dtype());
    workspace_bytes_ = plan_->workspace_bytes(s_.m);  // 0: the CPU plan keeps its own scratch
    saved_.assign(saved_bytes_ / sizeof(float) + 1, 0.0f);
    view_ = make_twell_view(saved_.data(), shape, plan_->saved_dtype(), cpu);

    b_ = DenseStepBuffers{};
    b_.m = s_.m, b_.k = s_.k, b_.n = s_.n, b_.dtype = DType::f32;
    b_.x = x_.data(), b_.dy = dy_.data(), b_.w1 = w1_.data(), b_.wd = wd_.data();
    b_.y = y_.data(), b_.dx = dx_.data(), b_.dw1 = dw1_.data(), b_.dwd = dwd_.data();
    b_.gu = gu_.data(), b_.d = d_.data(), b_.h = h_.data();
    for (DenseGemm g : {DenseGemm::gate_up, DenseGemm::down, DenseGemm::dh, DenseGemm::dx, DenseGemm::dw1,
                        DenseGemm::dwd})
      gemms_[int(g)] = dense_gemm(g, b_);  // checks every shape once
  }

  void release() override {
    plan_.reset();
    for (std::vector<float>* v :
         {&x_, &dy_, &w1_, &wd_, &y_, &dx_, &dw1_, &dwd_, &stats_, &gu_, &d_, &h_, &saved_})
      std::vector<float>().swap(*v);
  }

  void warm(TrainJob j) override { step(j); }

  double time_once(TrainJob j) override {
    const auto t0 = std::chrono::steady_clock::now();
    step(j);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  TrainingOutputs run_once(TrainJob j) override {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (std::vector<float>* v : {&y_, &dx_, &dw1_, &dwd_, &stats_}) std::fill(v->begin(), v->end(), nan);
    step(j);
    const size_t nk = size_t(s_.n * s_.k);
    TrainingOutputs o;
    o.y.resize(y_.size() * 4);
    std::memcpy(o.y.data(), y_.data(), o.y.size());
    o.dx.resize(dx_.size() * 4);
    std::memcpy(o.dx.data(), dx_.data(), o.dx.size());
    o.dgate.assign(dw1_.begin(), dw1_.begin() + nk);
    o.dup.assign(dw1_.begin() + nk, dw1_.end());
    o.ddown = dwd_;
    if (j == TrainJob::twell) {
      o.stats[0] = stats_[0];
      o.stats[1] = stats_[1];
      o.routed_rows = *view_.num_routed;
    }
    return o;
  }

  TrainingMemory memory(TrainJob j) const override {
    return j == TrainJob::dense ? dense_training_memory(s_, 0)
                                : twell_training_memory(s_, saved_bytes_, workspace_bytes_);
  }

 private:
  void step(TrainJob j) {
    if (j == TrainJob::twell) {
      const Device cpu = Device::cpu();
      TrainingForwardArgs f;
      f.x = TensorView::matrix(x_.data(), DType::f32, s_.m, s_.k, cpu);
      f.y = TensorView::matrix(y_.data(), DType::f32, s_.m, s_.k, cpu);
      f.stats = TensorView::vector(stats_.data(), DType::f32, 2, cpu);
      plan_->forward(f, view_);
      TrainingBackwardArgs b;
      b.dy = TensorView::matrix(dy_.data(), DType::f32, s_.m, s_.k, cpu);
      b.dx = TensorView::matrix(dx_.data(), DType::f32, s_.m, s_.k, cpu);
      b.dgate = TensorView::matrix(dw1_.data(), DType::f32, s_.n, s_.k, cpu);
      b.dup = TensorView::matrix(dw1_.data() + size_t(s_.n * s_.k), DType::f32, s_.n, s_.k, cpu);
      b.ddown = TensorView::matrix(dwd_.data(), DType::f32, s_.n, s_.k, cpu);
      plan_->backward(b, f.x, view_);
      return;
    }
    const int64_t m = s_.m, n = s_.n;
    const float l1m = m ? float(l1_coef_ / double(m)) : 0.0f;
    float* gu = gu_.data();
    float* d = d_.data();
    float* h = h_.data();
    run_gemm(gemms_[int(DenseGemm::gate_up)]);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const float gr = dense_relu(gu[r * 2 * n + c]);
        gu[r * 2 * n + c] = gr;
        h[r * n + c] = gr * gu[r * 2 * n + n + c];
      }
    run_gemm(gemms_[int(DenseGemm::down)]);
    run_gemm(gemms_[int(DenseGemm::dh)]);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const float gr = gu[r * 2 * n + c], u = gu[r * 2 * n + n + c], hv = gr * u;
        float dg, du;
        dense_backward_element(d[r * 2 * n + c], gr, u, hv, l1m, dg, du);
        d[r * 2 * n + c] = dg;
        d[r * 2 * n + n + c] = du;
        h[r * n + c] = hv;
      }
    run_gemm(gemms_[int(DenseGemm::dx)]);
    run_gemm(gemms_[int(DenseGemm::dw1)]);
    run_gemm(gemms_[int(DenseGemm::dwd)]);
  }

  testing::ProblemSpec s_;
  double l1_coef_ = 0;
  std::vector<float> x_, dy_, w1_, wd_, y_, dx_, dw1_, dwd_, stats_, gu_, d_, h_, saved_;
  std::unique_ptr<TrainingPlan> plan_;
  size_t saved_bytes_ = 0, workspace_bytes_ = 0;
  TwellView view_;
  DenseStepBuffers b_;
  ColMajorGemm gemms_[6];
};

}  // namespace

std::unique_ptr<TrainingRunner> make_cpu_training_runner() { return std::make_unique<CpuTrainingRunner>(); }

}  // namespace twell::bench
