#include "slack.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace twell::testing {
namespace {

using reference::Matrix;

// The noise bound of a length-`len` fp32 dot product, per unit of sum |terms|.
double noise_unit(int64_t len) { return 4 * std::sqrt(double(std::max<int64_t>(len, 1))) * std::ldexp(1.0, -24); }

std::vector<double> row_norms(const Matrix& a) {
  std::vector<double> out(static_cast<size_t>(a.rows));
  for (int64_t r = 0; r < a.rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < a.cols; ++c) s += a.at(r, c) * a.at(r, c);
    out[size_t(r)] = std::sqrt(s);
  }
  return out;
}

double abs_dot(const Matrix& a, int64_t i, const Matrix& b, int64_t j) {
  double s = 0;
  for (int64_t c = 0; c < a.cols; ++c) s += std::fabs(a.at(i, c) * b.at(j, c));
  return s;
}

double norm2(const std::vector<double>& v) {
  double s = 0;
  for (double e : v) s += e * e;
  return std::sqrt(s);
}

// The summation noise of an output accumulated over `len` terms, in Frobenius norm, from the sums
// of |terms| of each of its elements.
double output_noise(const Matrix& abs_sum, int64_t len) {
  return noise_unit(len) * norm2(abs_sum.v);
}

}  // namespace

Fp32Slack fp32_slack(const reference::Weights& w, const Matrix& x, const Matrix& dy, const reference::Forward& f,
                     double l1_coef) {
  const bool gated = w.kind == FfnKind::gated;
  const bool grads = dy.rows > 0;
  const Matrix& first = gated ? w.gate : w.up;
  const int64_t m = x.rows, n = first.rows, k = first.cols;
  const double nu = noise_unit(k), s = m > 0 ? l1_coef / double(m) : 0.0;
  const std::vector<double> x_norm = row_norms(x), first_norm = row_norms(first), up_norm = row_norms(w.up),
                            down_norm = row_norms(w.down), dy_norm = grads ? row_norms(dy) : std::vector<double>();
  std::vector<double> y_row(static_cast<size_t>(m)), dx_row(static_cast<size_t>(m)),
      dfirst_row(static_cast<size_t>(n)), dsecond_row(static_cast<size_t>(n)), ddown_row(static_cast<size_t>(n));
  // |terms| summed over each output's contraction, for the output GEMMs' own summation noise.
  Matrix y_abs(m, k), dx_abs(grads ? m : 0, k), dfirst_abs(grads ? n : 0, k), dsecond_abs(grads ? n : 0, k),
      ddown_abs(grads ? n : 0, k);
  Fp32Slack out;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const double g = f.gate_pre.at(i, j);
      // sum |x_c w_c| <= |x| |w|: most inactive entries are beyond noise by that bound alone, and
      // need no O(K) sum (the oracle's own cost, for every gate value, otherwise).
      if (g < 0 && -g > nu * x_norm[size_t(i)] * first_norm[size_t(j)]) continue;
      const double eg = nu * abs_dot(x, i, first, j);
      const bool flip = std::fabs(g) <= eg;
      if (g <= 0 && !flip) continue;  // inactive beyond doubt: h is exactly 0 in every order
      out.entries += flip;
      const double u = gated ? f.up.at(i, j) : 1.0, eu = gated ? nu * abs_dot(x, i, w.up, j) : 0.0;
      const double gp = std::max(g, 0.0) + eg;  // a bound of relu(g) as any order computes it
      const double dh_bound = gated ? eg * std::fabs(u) + gp * eu : eg;
      const double h_abs = gated ? gp * (std::fabs(u) + eu) : gp;
      y_row[size_t(i)] += dh_bound * down_norm[size_t(j)];
      for (int64_t c = 0; c < k; ++c) y_abs.at(i, c) += h_abs * std::fabs(w.down.at(j, c));
      if (!grads) continue;
      double dh = 0;  // the upstream gradient of h, dy . Wd[j]
      for (int64_t c = 0; c < k; ++c) dh += dy.at(i, c) * w.down.at(j, c);
      dh = std::fabs(dh);
      const double ed = nu * abs_dot(dy, i, w.down, j), a = dh + ed + s;
      const bool sign_flip = gated && std::fabs(u) <= eu;  // sign(h) of the L1 term may flip
      double e_first, e_second = 0, first_abs, second_abs = 0;
      if (gated) {
        e_first = flip ? a * (std::fabs(u) + eu) : ed * std::fabs(u) + (a + s) * eu;
        e_second = flip ? 2 * a * eg : ed * std::fabs(g) + a * eg + (sign_flip ? 2 * s * gp : 0.0);
        first_abs = a * (std::fabs(u) + eu);
        second_abs = a * gp;
      } else {
        e_first = flip ? a : ed;
        first_abs = a;
      }
      dfirst_row[size_t(j)] += e_first * x_norm[size_t(i)];
      dsecond_row[size_t(j)] += e_second * x_norm[size_t(i)];
      dx_row[size_t(i)] += e_first * first_norm[size_t(j)] + e_second * up_norm[size_t(j)];
      ddown_row[size_t(j)] += dh_bound * dy_norm[size_t(i)];
      for (int64_t c = 0; c < k; ++c) {
        dfirst_abs.at(j, c) += first_abs * std::fabs(x.at(i, c));
        dsecond_abs.at(j, c) += second_abs * std::fabs(x.at(i, c));
        dx_abs.at(i, c) += first_abs * std::fabs(first.at(j, c)) + second_abs * std::fabs(w.up.at(j, c));
        ddown_abs.at(j, c) += h_abs * std::fabs(dy.at(i, c));
      }
    }
  out.y = norm2(y_row) + output_noise(y_abs, n);
  if (grads) {
    out.dx = norm2(dx_row) + output_noise(dx_abs, gated ? 2 * n : n);
    out.dfirst = norm2(dfirst_row) + output_noise(dfirst_abs, m);
    out.dsecond = gated ? norm2(dsecond_row) + output_noise(dsecond_abs, m) : 0.0;
    out.ddown = norm2(ddown_row) + output_noise(ddown_abs, m);
  }
  return out;
}

double with_slack(double relative_tolerance, double abs_slack, const Matrix& ref) {
  const double norm = norm2(ref.v);
  return norm > 0 ? relative_tolerance + abs_slack / norm : relative_tolerance;
}

}  // namespace twell::testing
