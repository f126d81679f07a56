// CPU training backend: exact, sparse where the math allows, simple loops over the hybrid layout.
// Forward: dense gate GEMM, then per row (one thread each) the active entries get u = x . Wu[n]
// and y gets the sparse down projection; rows over a tile's capacity become dense backup rows
// (gathered sgemms). Backward: per row dh, dg, du and dx over the row's entries; weight gradients
// per neuron (one thread each) through the column index, in fixed row order (deterministic).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/backend.hpp"
#include "cpu/blas.hpp"
#include "cpu/kernels.hpp"
#include "twell/format.hpp"

namespace twell::detail {

namespace {

// Saved for backward: the hybrid layout in fp32 (gated: planes relu(g), u; plain: plane h).
class CpuSaved final : public SavedState {
 public:
  TwellMatrix act;
  size_t bytes() const override {
    const TwellShape& s = act.shape();
    const size_t slots = size_t(s.rows * s.slots_per_row());
    return slots * (size_t(s.planes) * 4 + 2) + size_t(s.rows * s.num_tiles()) * 2 +
           size_t(s.rows) * 8 + size_t(s.planes * s.backup_capacity * s.cols) * 4;
  }
  int64_t routed_rows() const override { return act.num_routed(); }
};

class CpuTraining final : public TrainingBackend {
 public:
  CpuTraining(const FfnWeights& w, const TrainingOptions& o) : w_(w), opt_(o) {}

  std::unique_ptr<SavedState> forward(const TrainingForwardArgs& a, Stream) override {
    const int64_t m = a.x.shape[0], k = w_.hidden(), n = w_.intermediate();
    const bool gated = w_.kind == FfnKind::gated;
    Weights32 W = weights32();
    const std::vector<float> x = as_f32(a.x);
    std::vector<float> g(size_t(m * n));
    cpu::gemm_nt(m, n, k, x.data(), W.first, g.data());

    TwellShape shape;
    shape.rows = m;
    shape.cols = n;
    shape.tile = opt_.tile;
    shape.capacity = opt_.capacity;
    shape.planes = gated ? 2 : 1;
    // Rows with a tile over capacity go to the backup; count the active entries on the way.
    std::vector<uint8_t> over(static_cast<size_t>(m));
    int64_t active = 0;
#pragma omp parallel for schedule(dynamic, 8) reduction(+ : active)
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t t = 0; t < shape.num_tiles(); ++t) {
        int64_t cnt = 0;
        for (int64_t c = t * shape.tile; c < std::min(n, (t + 1) * shape.tile); ++c)
          cnt += g[size_t(r * n + c)] > 0.0f;
        over[size_t(r)] |= cnt > shape.capacity;
        active += cnt;
      }
    }
    std::vector<int32_t> routed;
    for (int64_t r = 0; r < m; ++r)
      if (over[size_t(r)]) routed.push_back(int32_t(r));
    shape.backup_capacity = int64_t(routed.size());
    auto saved = std::make_unique<CpuSaved>();
    saved->act = TwellMatrix(shape, DType::f32);
    TwellView v = saved->act.view();
    std::vector<float> y(size_t(m * k), 0.0f);
    fill_compact(v, over, x, g, W, y);
    fill_routed(v, routed, x, g, W, y);

    store(y, a.y);
    if (a.stats.defined()) {
      auto* st = static_cast<float*>(a.stats.data);
      st[0] = m ? float(double(active) / double(m)) : 0.0f;
      st[1] = m ? float(l1_sum(v) / double(m)) : 0.0f;
    }
    return saved;
  }

  void backward(const TrainingBackwardArgs& a, const SavedState& base, Stream) override {
    const auto& saved = static_cast<const CpuSaved&>(base);
    TwellMatrix& act = const_cast<TwellMatrix&>(saved.act);
    const TwellView v = act.view();
    const TwellShape& s = v.shape;
    const int64_t m = s.rows, k = w_.hidden(), n = w_.intermediate();
    const bool gated = w_.kind == FfnKind::gated;
    Weights32 W = weights32();
    const std::vector<float> x = as_f32(saved.x), dy = as_f32(a.dy);
    const float l1 = m ? float(opt_.l1_coef / double(m)) : 0.0f;

    // Per-entry gradients, laid out like the saved values: dg (w.r.t. the gate pre-activation,
    // or the up pre-activation for plain) and du (gated), compact slots then backup rows.
    const size_t slots = size_t(m * s.slots_per_row()), dense = size_t(s.backup_capacity * n);
    std::vector<float> dg(slots + dense, 0.0f), du(gated ? slots + dense : 0, 0.0f);
    std::vector<float> dx(size_t(m * k), 0.0f);
    const auto* val = static_cast<const float*>(v.values);
    const auto* bk = static_cast<const float*>(v.backup);
    // Gradient of one entry from its dh (dy . Wd[n] + the L1 term).
    auto entry_grad = [&](float gv, float uv, float dh_dy, float* dgo, float* duo) {
      const float h = gated ? gv * uv : gv;
      const float dh = dh_dy + l1 * float((h > 0.0f) - (h < 0.0f));
      *dgo = gv > 0.0f ? (gated ? dh * uv : dh) : 0.0f;
      if (gated) *duo = dh * gv;
    };
#pragma omp parallel for schedule(dynamic, 8)
    for (int64_t r = 0; r < m; ++r) {
      if (v.row_slot[r] >= 0) continue;
      const float* dyr = dy.data() + r * k;
      float* dxr = dx.data() + r * k;
      for (int64_t t = 0; t < s.num_tiles(); ++t) {
        const int64_t slot0 = (r * s.num_tiles() + t) * s.capacity;
        for (int64_t e = 0; e < v.counts[r * s.num_tiles() + t]; ++e) {
          const int64_t i = slot0 + e, nrn = t * s.tile + v.cols[i];
          const float uv = gated ? val[slots + size_t(i)] : 1.0f;
          float gu = 0.0f;
          entry_grad(val[i], uv, cpu::dot(dyr, W.down + nrn * k, k), &dg[size_t(i)],
                     gated ? &du[size_t(i)] : &gu);
          cpu::axpy(dg[size_t(i)], W.first + nrn * k, dxr, k);
          if (gated) cpu::axpy(du[size_t(i)], W.up + nrn * k, dxr, k);
        }
      }
    }
    routed_backward(v, dy, W, l1, dg.data() + slots, gated ? du.data() + slots : nullptr, dx);
    store(dx, a.dx);

    // Weight gradients, one neuron per thread, rows in ascending order.
    const ColumnIndex ix = build_column_index(v);
    auto* dgate = gated ? static_cast<float*>(a.dgate.data) : nullptr;
    auto* dup = static_cast<float*>(a.dup.data);
    auto* ddown = static_cast<float*>(a.ddown.data);
    auto at = [&](const std::vector<float>& arr, int64_t pos) {
      return (pos & ColumnIndex::kBackupBit) ? arr[slots + size_t(pos & ~ColumnIndex::kBackupBit)]
                                             : arr[size_t(pos)];
    };
    auto value = [&](int plane, int64_t pos) {
      return (pos & ColumnIndex::kBackupBit)
                 ? bk[size_t(plane) * dense + size_t(pos & ~ColumnIndex::kBackupBit)]
                 : val[size_t(plane) * slots + size_t(pos)];
    };
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t nrn = 0; nrn < n; ++nrn) {
      float* gw = gated ? dgate + nrn * k : nullptr;
      float* uw = dup + nrn * k;
      float* dw = ddown + nrn * k;
      if (gw) std::memset(gw, 0, size_t(k) * 4);
      std::memset(uw, 0, size_t(k) * 4);
      std::memset(dw, 0, size_t(k) * 4);
      for (int64_t j = ix.col_ptr[size_t(nrn)]; j < ix.col_ptr[size_t(nrn + 1)]; ++j) {
        const int64_t r = ix.row[size_t(j)], pos = ix.pos[size_t(j)];
        const float* xr = x.data() + r * k;
        const float h = gated ? value(0, pos) * value(1, pos) : value(0, pos);
        cpu::axpy(h, dy.data() + r * k, dw, k);
        if (gated) {
          cpu::axpy(at(dg, pos), xr, gw, k);
          cpu::axpy(at(du, pos), xr, uw, k);
        } else {
          cpu::axpy(at(dg, pos), xr, uw, k);
        }
      }
    }
  }

 private:
  struct Weights32 {
    std::vector<float> first_c, up_c, down_c;
    const float* first = nullptr;
    const float* up = nullptr;
    const float* down = nullptr;
  };

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
    const bool gated = w_.kind == FfnKind::gated;
    W.first = view(gated ? w_.gate : w_.up, W.first_c);
    W.up = gated ? view(w_.up, W.up_c) : W.first;
    W.down = view(w_.down, W.down_c);
    return W;
  }

  static std::vector<float> as_f32(const TensorView& t) {
    std::vector<float> out(size_t(t.numel()));
    cpu::to_f32(t.data, t.dtype, out.data(), t.numel());
    return out;
  }

  static void store(const std::vector<float>& src, const TensorView& dst) {
    cpu::from_f32(src.data(), dst.dtype, dst.data, dst.numel());
  }

  // Compact rows: entries of relu(g) (and u for gated) and the sparse down projection.
  void fill_compact(TwellView& v, const std::vector<uint8_t>& over, const std::vector<float>& x,
                    const std::vector<float>& g, const Weights32& W, std::vector<float>& y) const {
    const TwellShape& s = v.shape;
    const int64_t k = w_.hidden(), n = w_.intermediate();
    const bool gated = w_.kind == FfnKind::gated;
    const size_t slots = size_t(s.rows * s.slots_per_row());
    auto* val = static_cast<float*>(v.values);
#pragma omp parallel for schedule(dynamic, 8)
    for (int64_t r = 0; r < s.rows; ++r) {
      v.row_slot[r] = -1;
      if (over[size_t(r)]) continue;  // counts stay 0; fill_routed gives the row its slot
      const float* gr = g.data() + r * n;
      const float* xr = x.data() + r * k;
      float* yr = y.data() + r * k;
      for (int64_t t = 0; t < s.num_tiles(); ++t) {
        const int64_t slot0 = (r * s.num_tiles() + t) * s.capacity;
        int64_t e = 0;
        for (int64_t c = t * s.tile; c < std::min(n, (t + 1) * s.tile); ++c) {
          if (!(gr[c] > 0.0f)) continue;
          const int64_t i = slot0 + e++;
          v.cols[i] = uint16_t(c - t * s.tile);
          val[i] = gr[c];
          float h = gr[c];
          if (gated) {
            const float u = cpu::dot(xr, W.up + c * k, k);
            val[slots + size_t(i)] = u;
            h *= u;
          }
          cpu::axpy(h, W.down + c * k, yr, k);
        }
        v.counts[r * s.num_tiles() + t] = uint16_t(e);
      }
    }
  }

  // Routed rows: dense backup rows of relu(g) (and u) and a dense down projection.
  void fill_routed(TwellView& v, const std::vector<int32_t>& routed, const std::vector<float>& x,
                   const std::vector<float>& g, const Weights32& W, std::vector<float>& y) const {
    const int64_t R = int64_t(routed.size()), k = w_.hidden(), n = w_.intermediate();
    if (R == 0) return;
    const bool gated = w_.kind == FfnKind::gated;
    auto* bk = static_cast<float*>(v.backup);
    std::vector<float> xg(size_t(R * k)), h(size_t(R * n)), yg(size_t(R * k));
    for (int64_t i = 0; i < R; ++i) {
      const int64_t r = routed[size_t(i)];
      v.row_slot[r] = int32_t(i);
      v.routed_rows[i] = int32_t(r);
      std::memcpy(xg.data() + i * k, x.data() + r * k, size_t(k) * 4);
      for (int64_t c = 0; c < n; ++c) bk[i * n + c] = std::max(g[size_t(r * n + c)], 0.0f);
    }
    *v.num_routed = int32_t(R);
    float* u = bk + R * n;  // plane 1 of the backup (gated)
    if (gated) cpu::gemm_nt(R, n, k, xg.data(), W.up, u);
    for (int64_t i = 0; i < R * n; ++i) h[size_t(i)] = gated ? bk[i] * u[i] : bk[i];
    cpu::gemm_nn(R, k, n, h.data(), W.down, yg.data());
    for (int64_t i = 0; i < R; ++i)
      std::memcpy(y.data() + routed[size_t(i)] * k, yg.data() + i * k, size_t(k) * 4);
  }

  // Backward of routed rows: dense dh = dy Wd^T on the gathered rows, then dg, du and dx.
  void routed_backward(const TwellView& v, const std::vector<float>& dy, const Weights32& W,
                       float l1, float* dg, float* du, std::vector<float>& dx) const {
    const int64_t R = *v.num_routed, k = w_.hidden(), n = w_.intermediate();
    if (R == 0) return;
    const bool gated = w_.kind == FfnKind::gated;
    const auto* bk = static_cast<const float*>(v.backup);
    const int64_t cap = v.shape.backup_capacity;
    std::vector<float> dyg(size_t(R * k)), dh(size_t(R * n)), dxg(size_t(R * k));
    for (int64_t i = 0; i < R; ++i)
      std::memcpy(dyg.data() + i * k, dy.data() + v.routed_rows[i] * k, size_t(k) * 4);
    cpu::gemm_nt(R, n, k, dyg.data(), W.down, dh.data());
    for (int64_t i = 0; i < R * n; ++i) {
      const float gv = bk[i], uv = gated ? bk[cap * n + i] : 1.0f;
      const float h = gv * uv;
      const float d = dh[size_t(i)] + l1 * float((h > 0.0f) - (h < 0.0f));
      dg[i] = gv > 0.0f ? d * uv : 0.0f;
      if (gated) du[i] = d * gv;
    }
    cpu::gemm_nn(R, k, n, dg, W.first, dxg.data());
    if (gated) cpu::gemm_nn(R, k, n, du, W.up, dxg.data(), 1.0f);
    for (int64_t i = 0; i < R; ++i)
      std::memcpy(dx.data() + v.routed_rows[i] * k, dxg.data() + i * k, size_t(k) * 4);
  }

  static double l1_sum(const TwellView& v) {
    const TwellShape& s = v.shape;
    const size_t slots = size_t(s.rows * s.slots_per_row());
    const auto* val = static_cast<const float*>(v.values);
    const auto* bk = static_cast<const float*>(v.backup);
    double sum = 0;
    for (int64_t r = 0; r < s.rows; ++r) {
      if (v.row_slot[r] >= 0) continue;
      for (int64_t t = 0; t < s.num_tiles(); ++t)
        for (int64_t e = 0; e < v.counts[r * s.num_tiles() + t]; ++e) {
          const size_t i = size_t((r * s.num_tiles() + t) * s.capacity + e);
          sum += std::fabs(double(val[i]) * (s.planes == 2 ? double(val[slots + i]) : 1.0));
        }
    }
    const int64_t dense = s.backup_capacity * s.cols;
    for (int64_t i = 0; i < int64_t(*v.num_routed) * s.cols; ++i)
      sum += std::fabs(double(bk[i]) * (s.planes == 2 ? double(bk[dense + i]) : 1.0));
    return sum;
  }

  FfnWeights w_;
  TrainingOptions opt_;
};

}  // namespace

std::unique_ptr<TrainingBackend> make_cpu_training(const FfnWeights& w, const TrainingOptions& o) {
  return std::make_unique<CpuTraining>(w, o);
}

}  // namespace twell::detail
