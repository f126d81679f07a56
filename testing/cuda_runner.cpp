// CUDA runner: CUDA-event timings on a non-blocking stream, with the L2 cache flushed (a memset of
// twice its size) before every timed run so that no run starts with weights already in L2.
// The gate-only floor is one cublasGemmEx (16-bit in and out, fp32 compute). With replay_graphs,
// each job is captured into a CUDA graph at its first timed run and the replays are timed: the
// graph holds kGraphLayers calls in turn, each on its own copy of the weights with its own plan (a
// decoding step's layers: every call's weights come from memory), and a sample is the replay's
// time over kGraphLayers, so the graph launch is paid once per step, as in a model.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>
#include <utility>
#include <vector>

#include "cuda_rig.hpp"
#include "runner.hpp"
#include "twell/twell.hpp"

namespace twell::testing {
namespace {

constexpr int kGraphLayers = 8;

class CudaRunner final : public Runner {
 public:
  CudaRunner() { counters_.resize(2 * sizeof(int64_t)); }
  ~CudaRunner() override {
    drop_graphs();
    plans_.clear();
  }

  std::string device() const override { return rig_.name; }
  std::string backend() const override { return "cuda"; }

  void load(Problem& p) override {
    drop_graphs();
    plans_.clear();
    spec_ = p.spec;
    const size_t es = dtype_size(spec_.dtype);
    auto up = [&](DeviceBuffer& d, const std::vector<uint8_t>& h) {
      d.resize(h.size());
      check(cudaMemcpy(d.p, h.data(), h.size(), cudaMemcpyHostToDevice), "upload");
    };
    up(x_, p.x);
    if (spec_.kind == FfnKind::gated) up(gate_, p.gate);
    up(up_, p.up);
    up(down_, p.down);
    y_.resize(size_t(spec_.m * spec_.k) * es);
    g_.resize(size_t(spec_.m * spec_.n) * es);
    const Device dev = Device::cuda(0);
    w_ = FfnWeights{};
    w_.kind = spec_.kind;
    if (spec_.kind == FfnKind::gated) w_.gate = TensorView::matrix(gate_.p, spec_.dtype, spec_.n, spec_.k, dev);
    w_.up = TensorView::matrix(up_.p, spec_.dtype, spec_.n, spec_.k, dev);
    w_.down = TensorView::matrix(down_.p, spec_.dtype, spec_.n, spec_.k, dev);
    copy_layers();
  }

  // Synchronised, so automatic dispatch sees each timing, and after an L2 flush as every timed run:
  // its trials see the weights come from memory, as the timed runs and a model's layers do.
  void warm(Job j) override {
    rig_.flush();
    job(j);
    check(cudaStreamSynchronize(stream_), "warm-up");
  }

  double time_once(Job j) override {
    if (!graphs_) return rig_.time([&] { job(j); });
    cudaGraphExec_t& exec = graphs_of_[int(j)];
    if (exec == nullptr) {
      cudaGraph_t graph = nullptr;
      check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
      job(j);
      check(cudaStreamEndCapture(stream_, &graph), "end capture");
      check(cudaGraphInstantiate(&exec, graph, 0), "instantiate graph");
      cudaGraphDestroy(graph);
    }
    return rig_.time([&] { check(cudaGraphLaunch(exec, stream_), "graph launch"); }) / layers();
  }

  // Every layer's plan runs (each keeps its own dispatch trials level with layer 0's); layer 0,
  // last, gives y, the counters and the run info.
  RunInfo run_once(Dispatch d, std::vector<uint8_t>& y_host) override {
    for (int l = layers() - 1; l >= 1; --l) plan_for(d, l).run(args(false), stream_);
    check(cudaMemsetAsync(y_.p, 0xff, y_.bytes, stream_), "poison y");
    InferencePlan& plan = plan_for(d);
    plan.run(args(true), stream_);
    check(cudaStreamSynchronize(stream_), "run");
    y_host.resize(size_t(spec_.m * spec_.k) * dtype_size(spec_.dtype));
    check(cudaMemcpy(y_host.data(), y_.p, y_host.size(), cudaMemcpyDeviceToHost), "download y");
    int64_t c[2];
    check(cudaMemcpy(c, counters_.p, sizeof c, cudaMemcpyDeviceToHost), "download counters");
    RunInfo info = plan.last_run();
    info.routed_rows = c[0];
    info.active = c[1];
    return info;
  }

  RunInfo last_run(Dispatch d) override { return plan_for(d).last_run(); }

 private:
  InferenceArgs args(bool with_counters) {
    const Device dev = Device::cuda(0);
    InferenceArgs a{TensorView::matrix(x_.p, spec_.dtype, spec_.m, spec_.k, dev),
                    TensorView::matrix(y_.p, spec_.dtype, spec_.m, spec_.k, dev), {}};
    if (with_counters) a.counters = TensorView::vector(counters_.p, DType::i64, 2, dev);
    return a;
  }

  void drop_graphs() {
    for (cudaGraphExec_t& g : graphs_of_)
      if (g != nullptr) cudaGraphExecDestroy(std::exchange(g, nullptr));
  }

  // With replay_graphs: layers 1.. of the graph, each a device copy of the loaded weights.
  void copy_layers() {
    more_layers_.clear();
    if (!graphs_) return;
    const size_t matrix = size_t(spec_.n * spec_.k) * dtype_size(spec_.dtype);
    const bool gated = spec_.kind == FfnKind::gated;
    const size_t set = (gated ? 3 : 2) * matrix;  // [gate,] up, down
    copies_.resize(set * size_t(kGraphLayers - 1));
    for (int l = 1; l < kGraphLayers; ++l) {
      uint8_t* at = copies_.at(set * size_t(l - 1));
      FfnWeights w = w_;
      auto copy = [&](TensorView& v, const DeviceBuffer& from) {
        check(cudaMemcpy(at, from.p, matrix, cudaMemcpyDeviceToDevice), "copy weights");
        v.data = std::exchange(at, at + matrix);
      };
      if (gated) copy(w.gate, gate_);
      copy(w.up, up_);
      copy(w.down, down_);
      more_layers_.push_back(w);
    }
  }

  void job(Job j) {
    for (int l = 0; l < layers(); ++l) {
      if (j != Job::gate) {
        plan_for(j == Job::dense ? Dispatch::force_dense : twell_dispatch_, l).run(args(false), stream_);
        continue;
      }
      // Row-major G[M, N] = x W^T is column-major G^T = W^T-view times x-view.
      const cudaDataType_t t = spec_.dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
      const FfnWeights& w = weights_of(l);
      const void* first = spec_.kind == FfnKind::gated ? w.gate.data : w.up.data;
      const float alpha = 1.0f, beta = 0.0f;
      const int m = int(spec_.m), n = int(spec_.n), k = int(spec_.k);
      check(cublasGemmEx(rig_.blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, first, t, k, x_.p, t, k, &beta,
                         g_.p, t, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    }
  }

  CudaRig rig_;
  cudaStream_t stream_ = rig_.stream;
  ProblemSpec spec_;
  DeviceBuffer x_, y_, g_, gate_, up_, down_, counters_;
  DeviceBuffer copies_;  // more_layers_' weights: [gate,] up, down per layer
  cudaGraphExec_t graphs_of_[3] = {};  // per Job, with replay_graphs
};

}  // namespace

std::unique_ptr<Runner> make_cuda_runner() { return std::make_unique<CudaRunner>(); }

}  // namespace twell::testing
