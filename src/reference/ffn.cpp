// fp64 oracle of the FFN forward and backward. Plain loops on purpose: this is the ground truth.
#include <cmath>
#include <limits>
#include <vector>

#include "twell/error.hpp"
#include "twell/reference.hpp"

namespace twell::reference {

Matrix from_view(const TensorView& t) {
  if (t.device != Device::cpu()) throw Error("reference", "tensor device", "cpu", to_string(t.device));
  if (t.rank != 2) throw Error("reference", "tensor", "rank 2", t.shape_string());
  Matrix m(t.shape[0], t.shape[1]);
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c)
      m.at(r, c) = load_float(t.data, t.dtype, r * t.stride[0] + c * t.stride[1]);
  return m;
}

Weights from_weights(const FfnWeights& w) {
  w.validate("reference");
  Weights r;
  r.kind = w.kind;
  if (w.kind == FfnKind::gated) r.gate = from_view(w.gate);
  r.up = from_view(w.up);
  r.down = from_view(w.down);
  return r;
}

namespace {

// Row loops run in parallel: rows are independent, so the arithmetic per element is unchanged.
// a [M, K] times b [N, K]^T -> [M, N]
Matrix times_transposed(const Matrix& a, const Matrix& b) {
  Matrix c(a.rows, b.rows);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < b.rows; ++j) {
      double s = 0;
      for (int64_t k = 0; k < a.cols; ++k) s += a.at(i, k) * b.at(j, k);
      c.at(i, j) = s;
    }
  return c;
}

// Whether each row of m holds only finite values. The products below skip a zero coefficient
// only against a finite row: 0 * Inf and 0 * NaN are NaN, as in a dense GEMM.
std::vector<bool> finite_rows(const Matrix& m) {
  std::vector<bool> finite(size_t(m.rows), true);
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c)
      if (!std::isfinite(m.at(r, c))) {
        finite[size_t(r)] = false;
        break;
      }
  return finite;
}

// a [M, N] times b [N, K] -> [M, K]
Matrix times(const Matrix& a, const Matrix& b) {
  Matrix c(a.rows, b.cols);
  const std::vector<bool> finite = finite_rows(b);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t n = 0; n < a.cols; ++n) {
      const double v = a.at(i, n);
      if (v == 0 && finite[size_t(n)]) continue;
      for (int64_t k = 0; k < b.cols; ++k) c.at(i, k) += v * b.at(n, k);
    }
  return c;
}

// a [M, N]^T times b [M, K] -> [N, K] (each sum over m in increasing order, as times adds them)
Matrix transposed_times(const Matrix& a, const Matrix& b) {
  Matrix t(a.cols, a.rows);
  for (int64_t m = 0; m < a.rows; ++m)
    for (int64_t n = 0; n < a.cols; ++n) t.at(n, m) = a.at(m, n);
  return times(t, b);
}

}  // namespace

Forward ffn_forward(const Weights& w, const Matrix& x) {
  Forward f;
  const bool gated = w.kind == FfnKind::gated;
  f.gate_pre = times_transposed(x, gated ? w.gate : w.up);
  if (gated) f.up = times_transposed(x, w.up);
  f.h = Matrix(x.rows, f.gate_pre.cols);
  for (size_t i = 0; i < f.h.v.size(); ++i)
    f.h.v[i] = relu(f.gate_pre.v[i]) * (gated ? f.up.v[i] : 1.0);
  f.y = times(f.h, w.down);
  return f;
}

Grads ffn_backward(const Weights& w, const Matrix& x, const Matrix& dy, double l1_coef) {
  const bool gated = w.kind == FfnKind::gated;
  const Forward f = ffn_forward(w, x);
  const double l1_scale = x.rows ? l1_coef / double(x.rows) : 0.0;
  Matrix dh = times_transposed(dy, w.down);  // [M, N]
  for (size_t i = 0; i < dh.v.size(); ++i) {
    const double h = f.h.v[i];
    dh.v[i] += l1_scale * double((h > 0) - (h < 0));
  }
  Matrix dgate_pre(dh.rows, dh.cols), dup;
  if (gated) dup = Matrix(dh.rows, dh.cols);
  for (size_t i = 0; i < dh.v.size(); ++i) {
    const bool active = relu_active(f.gate_pre.v[i]);
    dgate_pre.v[i] = active ? dh.v[i] * (gated ? f.up.v[i] : 1.0) : 0.0;
    if (gated) dup.v[i] = dh.v[i] * relu(f.gate_pre.v[i]);
  }
  Grads g;
  g.ddown = transposed_times(f.h, dy);
  if (gated) {
    g.dx = times(dgate_pre, w.gate);
    const Matrix dx_up = times(dup, w.up);
    for (size_t i = 0; i < g.dx.v.size(); ++i) g.dx.v[i] += dx_up.v[i];
    g.dgate = transposed_times(dgate_pre, x);
    g.dup = transposed_times(dup, x);
  } else {
    g.dx = times(dgate_pre, w.up);
    g.dup = transposed_times(dgate_pre, x);
  }
  return g;
}

Matrix ffn_forward_rounded(const Weights& w, const Matrix& x, DType t) {
  const bool gated = w.kind == FfnKind::gated;
  const Matrix& first = gated ? w.gate : w.up;
  const int64_t m_rows = x.rows, n = first.rows, k = first.cols;
  auto dot_f32 = [&](const Matrix& a, int64_t i, const Matrix& b, int64_t j) {
    float s = 0.0f;
    for (int64_t c = 0; c < k; ++c) s += float(a.at(i, c)) * float(b.at(j, c));
    return round_to(t, s);
  };
  Matrix h(m_rows, n), y(m_rows, k);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m_rows; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float g = float(relu(dot_f32(x, i, first, j)));
      h.at(i, j) = gated ? round_to(t, g * dot_f32(x, i, w.up, j)) : g;
    }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m_rows; ++i)
    for (int64_t c = 0; c < k; ++c) {
      float s = 0.0f;
      for (int64_t j = 0; j < n; ++j) s += float(h.at(i, j)) * float(w.down.at(j, c));
      y.at(i, c) = round_to(t, s);
    }
  return y;
}

double rel_error(const Matrix& a, const Matrix& b) {
  if (a.v.size() != b.v.size()) throw Error("rel_error", "shapes", "equal", "different");
  double num = 0, den = 0;
  for (size_t i = 0; i < a.v.size(); ++i) {
    if (!std::isfinite(a.v[i])) return std::numeric_limits<double>::infinity();
    num += (a.v[i] - b.v[i]) * (a.v[i] - b.v[i]);
    den += b.v[i] * b.v[i];
  }
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

}  // namespace twell::reference
