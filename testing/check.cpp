#include "check.hpp"

#include <algorithm>

namespace twell::testing {

std::vector<int64_t> oracle_rows(const Problem& p, int64_t limit) {
  const int64_t m = p.spec.m;
  std::vector<int64_t> rows;
  if (m <= limit) {
    for (int64_t r = 0; r < m; ++r) rows.push_back(r);
    return rows;
  }
  const int64_t step = m / limit + 1;
  for (int64_t r = 0; r < m; r += step) rows.push_back(r);
  rows.push_back(m - 1);
  for (int64_t r : p.special_rows)
    if (rows.size() < size_t(2 * limit)) rows.push_back(r);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

reference::Matrix take_rows(const reference::Matrix& a, const std::vector<int64_t>& rows) {
  reference::Matrix out(int64_t(rows.size()), a.cols);
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy_n(a.v.begin() + rows[i] * a.cols, a.cols, out.v.begin() + int64_t(i) * a.cols);
  return out;
}

double tolerance(const reference::Weights& w, const reference::Matrix& x, const reference::Matrix& y_ref, DType t) {
  const double plain = reference::rel_error(reference::ffn_forward_rounded(w, x, t), y_ref);
  const double floor = t == DType::f32 ? 1e-5 : 1e-3;
  return 2 * plain + floor;
}

ForwardCheck check_forward(Problem& p, const void* y_host, int64_t limit) {
  const auto rows = oracle_rows(p, limit);
  const reference::Weights w = reference::from_weights(p.weights());
  const reference::Matrix x = take_rows(reference::from_view(p.x_view()), rows);
  const reference::Forward f = reference::ffn_forward(w, x);
  const reference::Matrix y_all = reference::from_view(
      TensorView::matrix(const_cast<void*>(y_host), p.spec.dtype, p.spec.m, p.spec.k));
  const reference::Matrix y = take_rows(y_all, rows);
  ForwardCheck c;
  c.error = reference::rel_error(y, f.y);
  c.tolerance = tolerance(w, x, f.y, p.spec.dtype);
  for (int64_t r = 0; r < y.rows; ++r) {
    bool ref_zero = true, out_zero = true;
    for (int64_t k = 0; k < y.cols; ++k) {
      ref_zero = ref_zero && f.y.at(r, k) == 0;
      out_zero = out_zero && y.at(r, k) == 0;
    }
    if (ref_zero && !out_zero) c.zero_rows_exact = false;
  }
  return c;
}

}  // namespace twell::testing
