// CPU training backend: exact, sparse where the math allows.
// Forward: dense gate GEMM (sgemm); one thread per row packs the active entries with
// u = x . Wu[n] and the sparse down projection; rows with a tile over capacity are only listed and
// run densely on the gathered rows. Backward: one thread per compact row computes dh, dg, du and dx
// over its entries; weight gradients run one thread per neuron over the column index in ascending
// row order, then the routed rows (recomputed from x) add theirs through sgemms: deterministic.
// NaN and Inf follow the dense computation (relu(NaN) = NaN, h = relu(g) * u and du = dh * relu(g)
// as products, 0 * Inf = NaN in every GEMM): skipping an inactive neuron is exact only where its
// row of x and of dy is finite, so forward routes a row with a NaN or infinite gate value (as
// every one is when x's row is not finite) and backward also takes the compact rows whose dy is not
// finite densely.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "cpu/blas.hpp"
#include "cpu/kernels.hpp"
#include "cpu/threads.hpp"

namespace twell::detail {

namespace {

float sign(float v) { return float((v > 0.0f) - (v < 0.0f)); }

class CpuTraining final : public TrainingBackend {
 public:
  CpuTraining(const FfnWeights& w, const TrainingOptions& o)
      : w_(w), opt_(o), k_(w.hidden()), n_(w.intermediate()), gated_(w.kind == FfnKind::gated) {}

  DType saved_dtype() const override { return DType::f32; }
  bool wants_dense_layout(int64_t) override { return false; }
  bool supports_dense_layout() const override { return false; }
  int32_t compact_capacity(int64_t) override { return opt_.capacity; }  // min_capacity == capacity here
  size_t workspace_bytes(int64_t, SavedForm, TrainingCall) const override { return 0; }  // host scratch is its own
  void set_weights(const FfnWeights& w) override { w_ = w; }

  std::shared_ptr<void> allocate(size_t bytes) override {
    return std::shared_ptr<void>(std::calloc(1, bytes), std::free);
  }

  int64_t routed_rows(const TwellView& saved) override { return *saved.num_routed; }

  void seal_saved(const TwellView& saved, const TwellHeader& header, Stream) override { *saved.header = header; }
  // Every index backward reads, and the header (shape, dtype and this plan's tag), before any use.
  void check_saved(const TwellView& saved, const TwellHeader& expected, Stream) override {
    try {
      check_twell_header("TrainingPlan::backward", *saved.header, expected, OwnerCheck::match);
      validate_twell(saved);
    } catch (const Error& e) {
      throw Error("TrainingPlan::backward", "saved", "the state a forward of this plan wrote",
                  std::string("a corrupted or foreign buffer (") + e.what() + ")");
    }
  }

  void forward(const TrainingForwardArgs& a, const TwellView& v, Stream) override {
    const cpu::CallThreads team;
    const TwellShape& s = v.shape;
    const int64_t m = s.rows, nt = s.num_tiles();
    const Weights32 W = weights32();
    const std::vector<float> x = as_f32(a.x);
    std::vector<float> g(size_t(m * n_)), y(size_t(m * k_), 0.0f);
    cpu::gemm_nt(m, n_, k_, x.data(), W.first, g.data());

    const size_t slots = size_t(m * s.slots_per_row());
    auto* val = static_cast<float*>(v.values);
    std::vector<uint8_t> over(static_cast<size_t>(m));
    std::vector<double> l1_row(static_cast<size_t>(m), 0.0);
    int64_t active = 0;
#pragma omp parallel for schedule(dynamic, 8) reduction(+ : active)
    for (int64_t r = 0; r < m; ++r) {
      const float* gr = g.data() + r * n_;
      over[size_t(r)] = !cpu::all_finite(gr, n_);
      for (int64_t t = 0; t < nt; ++t) {
        int64_t cnt = 0;
        for (int64_t c = t * s.tile; c < std::min(n_, (t + 1) * s.tile); ++c) cnt += cpu::relu_active(gr[c]);
        over[size_t(r)] |= cnt > s.capacity;
        active += cnt;
      }
      v.row_slot[r] = -1;
      std::fill(v.counts + r * nt, v.counts + (r + 1) * nt, uint16_t(0));
      if (over[size_t(r)]) continue;
      const float* xr = x.data() + r * k_;
      float* yr = y.data() + r * k_;
      for (int64_t t = 0; t < nt; ++t) {
        int64_t e = 0;
        for (int64_t c = t * s.tile; c < std::min(n_, (t + 1) * s.tile); ++c) {
          if (!cpu::relu_active(gr[c])) continue;
          const int64_t i = (r * nt + t) * s.capacity + e++;
          v.cols[i] = uint16_t(c - t * s.tile);
          val[i] = gr[c];
          float h = gr[c];
          if (gated_) {
            const float u = cpu::dot(xr, W.up + c * k_, k_);
            val[slots + size_t(i)] = u;
            h *= u;
          }
          l1_row[size_t(r)] += std::fabs(double(h));
          cpu::axpy(h, W.down + c * k_, yr, k_);
        }
        v.counts[r * nt + t] = uint16_t(e);
      }
    }
    int32_t routed = 0;
    for (int64_t r = 0; r < m; ++r)
      if (over[size_t(r)]) {
        v.row_slot[r] = routed;
        v.routed_rows[routed++] = int32_t(r);
      }
    *v.num_routed = routed;

    // Routed rows: dense on the gathered rows.
    const Dense d = dense_rows(v.routed_rows, routed, x, W);
    std::vector<float> yg(size_t(routed * k_));
    cpu::gemm_nn(routed, k_, n_, d.h.data(), W.down, yg.data());
    for (int64_t i = 0; i < routed; ++i) {
      std::memcpy(y.data() + v.routed_rows[i] * k_, yg.data() + i * k_, size_t(k_) * 4);
      for (int64_t c = 0; c < n_; ++c) l1_row[size_t(v.routed_rows[i])] += std::fabs(double(d.h[size_t(i * n_ + c)]));
    }
    cpu::from_f32(y.data(), a.y.dtype, a.y.data, m * k_);
    if (a.stats.defined()) {
      double l1 = 0;
      for (double v1 : l1_row) l1 += v1;
      auto* st = static_cast<float*>(a.stats.data);
      st[0] = m ? float(double(active) / double(m)) : 0.0f;
      st[1] = m ? float(l1 / double(m)) : 0.0f;
    }
  }

  void backward(const TrainingBackwardArgs& a, const TensorView& xv, const TwellView& v,
                Stream) override {
    const cpu::CallThreads team;
    const TwellShape& s = v.shape;
    const int64_t m = s.rows, nt = s.num_tiles();
    const Weights32 W = weights32();
    const std::vector<float> x = as_f32(xv), dy = as_f32(a.dy);
    // Rows computed densely: the routed ones, and compact rows whose dy holds a NaN or Inf (there
    // dh is not finite at the inactive neurons either, so the dense du = dh * 0 is NaN, and so is
    // the dense 0 * dy in dWd).
    std::vector<uint8_t> is_dense(static_cast<size_t>(m));
    std::vector<int32_t> dense;
    for (int64_t r = 0; r < m; ++r)
      if (v.row_slot[r] >= 0 || !cpu::all_finite(dy.data() + r * k_, k_)) {
        is_dense[size_t(r)] = 1;
        dense.push_back(int32_t(r));
      }
    const double coef =
        a.l1_coef.defined() ? double(*static_cast<const float*>(a.l1_coef.data)) : opt_.l1_coef;
    const float l1 = m ? float(coef / double(m)) : 0.0f;
    const size_t slots = size_t(m * s.slots_per_row());
    const auto* val = static_cast<const float*>(v.values);

    // Compact rows: per-entry dg (w.r.t. the first GEMM's output) and du (gated), and dx.
    std::vector<float> dg(slots, 0.0f), du(gated_ ? slots : 0, 0.0f), dx(size_t(m * k_), 0.0f);
#pragma omp parallel for schedule(dynamic, 8)
    for (int64_t r = 0; r < m; ++r) {
      if (is_dense[size_t(r)]) continue;
      const float* dyr = dy.data() + r * k_;
      float* dxr = dx.data() + r * k_;
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t e = 0; e < v.counts[r * nt + t]; ++e) {
          const int64_t i = (r * nt + t) * s.capacity + e, nrn = t * s.tile + v.cols[i];
          const float gv = val[i], uv = gated_ ? val[slots + size_t(i)] : 1.0f;
          const float dh = cpu::dot(dyr, W.down + nrn * k_, k_) + l1 * sign(gv * uv);
          dg[size_t(i)] = dh * uv;
          cpu::axpy(dg[size_t(i)], W.first + nrn * k_, dxr, k_);
          if (gated_) {
            du[size_t(i)] = dh * gv;
            cpu::axpy(du[size_t(i)], W.up + nrn * k_, dxr, k_);
          }
        }
    }

    // Weight gradients of the compact rows, one neuron per thread, rows ascending.
    const ColumnIndex ix = build_column_index(v, RoutedRows::skip);
    float* dgate = gated_ ? static_cast<float*>(a.dgate.data) : nullptr;
    float* dup = static_cast<float*>(a.dup.data);
    float* ddown = static_cast<float*>(a.ddown.data);
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t nrn = 0; nrn < n_; ++nrn) {
      float* first_w = (gated_ ? dgate : dup) + nrn * k_;
      float* dw = ddown + nrn * k_;
      std::memset(first_w, 0, size_t(k_) * 4);
      std::memset(dw, 0, size_t(k_) * 4);
      if (gated_) std::memset(dup + nrn * k_, 0, size_t(k_) * 4);
      for (int64_t j = ix.col_ptr[size_t(nrn)]; j < ix.col_ptr[size_t(nrn + 1)]; ++j) {
        const int64_t r = ix.row[size_t(j)];
        if (is_dense[size_t(r)]) continue;
        const size_t pos = size_t(ix.pos[size_t(j)]);
        const float* xr = x.data() + r * k_;
        cpu::axpy(gated_ ? val[pos] * val[slots + pos] : val[pos], dy.data() + r * k_, dw, k_);
        cpu::axpy(dg[pos], xr, first_w, k_);
        if (gated_) cpu::axpy(du[pos], xr, dup + nrn * k_, k_);
      }
    }

    dense_rows_backward(dense, x, dy, W, l1, dx, gated_ ? dgate : dup, dup, ddown);
    cpu::from_f32(dx.data(), a.dx.dtype, a.dx.data, m * k_);
  }

 private:

  struct Weights32 {
    std::vector<float> first_c, up_c, down_c;
    const float* first = nullptr;
    const float* up = nullptr;
    const float* down = nullptr;
  };

  // Dense recomputation of listed rows: gathered x, relu(g) (zero where inactive), u, h = relu(g) u.
  struct Dense {
    std::vector<float> x, g, u, h;
  };

  Dense dense_rows(const int32_t* rows, int64_t count, const std::vector<float>& x,
                   const Weights32& W) const {
    Dense d;
    d.x.resize(size_t(count * k_));
    d.g.resize(size_t(count * n_));
    d.h.resize(d.g.size());
    for (int64_t i = 0; i < count; ++i)
      std::memcpy(d.x.data() + i * k_, x.data() + rows[i] * k_, size_t(k_) * 4);
    cpu::gemm_nt(count, n_, k_, d.x.data(), W.first, d.g.data());
    if (gated_) {
      d.u.resize(d.g.size());
      cpu::gemm_nt(count, n_, k_, d.x.data(), W.up, d.u.data());
    }
    for (size_t i = 0; i < d.g.size(); ++i) {
      d.g[i] = cpu::relu(d.g[i]);
      d.h[i] = gated_ ? d.g[i] * d.u[i] : d.g[i];
    }
    return d;
  }
  // The backward of the rows computed densely (`dense`, ascending): recomputed from x, their dx
  // rows written into dx, their weight gradients added to first_w (dW1), dup (gated) and ddown.
  void dense_rows_backward(const std::vector<int32_t>& dense, const std::vector<float>& x,
                           const std::vector<float>& dy, const Weights32& W, float l1, std::vector<float>& dx,
                           float* first_w, float* dup, float* ddown) const {
    const int64_t num_dense = int64_t(dense.size());
    if (num_dense == 0) return;
    const Dense d = dense_rows(dense.data(), num_dense, x, W);
    std::vector<float> dyg(size_t(num_dense * k_)), dh(size_t(num_dense * n_)), dgd(dh.size()),
        dud(gated_ ? dh.size() : 0), dxg(size_t(num_dense * k_));
    for (int64_t i = 0; i < num_dense; ++i)
      std::memcpy(dyg.data() + i * k_, dy.data() + dense[size_t(i)] * k_, size_t(k_) * 4);
    cpu::gemm_nt(num_dense, n_, k_, dyg.data(), W.down, dh.data());
    for (size_t i = 0; i < dh.size(); ++i) {
      const float gv = d.g[i], uv = gated_ ? d.u[i] : 1.0f;
      const float dhi = dh[i] + l1 * sign(d.h[i]);
      dgd[i] = cpu::relu_active(gv) ? dhi * uv : 0.0f;
      if (gated_) dud[i] = dhi * gv;
    }
    cpu::gemm_nn(num_dense, k_, n_, dgd.data(), W.first, dxg.data());
    if (gated_) cpu::gemm_nn(num_dense, k_, n_, dud.data(), W.up, dxg.data(), 1.0f);
    for (int64_t i = 0; i < num_dense; ++i)
      std::memcpy(dx.data() + dense[size_t(i)] * k_, dxg.data() + i * k_, size_t(k_) * 4);
    cpu::gemm_tn_acc(n_, k_, num_dense, dgd.data(), d.x.data(), first_w);
    if (gated_) cpu::gemm_tn_acc(n_, k_, num_dense, dud.data(), d.x.data(), dup);
    cpu::gemm_tn_acc(n_, k_, num_dense, d.h.data(), dyg.data(), ddown);
  }

  // fp32 views of the current weights (converted copies for 16-bit weights: they may change
  // between steps, so nothing is cached).
  Weights32 weights32() const {
    Weights32 W;
    auto view = [](const TensorView& t, std::vector<float>& c) -> const float* {
      if (t.dtype == DType::f32) return static_cast<const float*>(t.data);
      c.resize(size_t(t.numel()));
      cpu::to_f32(t.data, t.dtype, c.data(), t.numel());
      return c.data();
    };
    W.first = view(gated_ ? w_.gate : w_.up, W.first_c);
    W.up = gated_ ? view(w_.up, W.up_c) : W.first;
    W.down = view(w_.down, W.down_c);
    return W;
  }

  static std::vector<float> as_f32(const TensorView& t) {
    std::vector<float> out(size_t(t.numel()));
    cpu::to_f32(t.data, t.dtype, out.data(), t.numel());
    return out;
  }

  FfnWeights w_;
  TrainingOptions opt_;
  int64_t k_, n_;
  bool gated_;
};

}  // namespace

std::unique_ptr<TrainingBackend> make_cpu_training(const FfnWeights& w, const TrainingOptions& o) {
  return std::make_unique<CpuTraining>(w, o);
}

}  // namespace twell::detail
