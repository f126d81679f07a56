#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "twell/error.hpp"

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

double tolerance(const reference::Weights& w, const reference::Matrix& x, const reference::Forward& f, DType t) {
  const double plain = reference::rel_error(reference::ffn_forward_rounded(w, x, t), f.y);
  const double floor = t == DType::f32 ? 1e-5 : 1e-3;
  return with_slack(2 * plain + floor, fp32_slack(w, x, reference::Matrix(), f, 0.0).y, f.y);
}

reference::Matrix rows_of(const TensorView& t, const std::vector<int64_t>& rows) {
  if (t.rank != 2) throw Error("rows_of", "tensor", "rank 2", t.shape_string());
  reference::Matrix out(int64_t(rows.size()), t.shape[1]);
  const size_t es = dtype_size(t.dtype);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= t.shape[0])
      throw Error("rows_of", "rows", "within [0, " + std::to_string(t.shape[0]) + ")",
                  std::to_string(rows[i]));
    const auto* base = static_cast<const uint8_t*>(t.data) + size_t(rows[i] * t.stride[0]) * es;
    TensorView row = TensorView::matrix(const_cast<uint8_t*>(base), t.dtype, 1, t.shape[1]);
    row.stride[1] = t.stride[1];
    const reference::Matrix r = reference::from_view(row);
    std::copy(r.v.begin(), r.v.end(), out.v.begin() + int64_t(i) * out.cols);
  }
  return out;
}

std::vector<int64_t> boundary_rows(const Problem& p, const std::vector<int64_t>& widths, int64_t limit) {
  std::vector<int64_t> rows = oracle_rows(p, limit);
  const int64_t m = p.spec.m;
  const int64_t es = int64_t(dtype_size(p.spec.dtype));
  for (int64_t w : widths)
    for (int64_t unit : {int64_t(1), es})  // elements, bytes
      for (int64_t boundary : {int64_t(1) << 31, int64_t(1) << 32}) {
        const int64_t row = boundary / (w * unit);  // the row holding element (byte) `boundary`
        for (int64_t r = row - 1; r <= row + 1; ++r)
          if (r >= 0 && r < m) rows.push_back(r);
      }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

ForwardCheck check_forward(Problem& p, const void* y_host, int64_t limit) {
  return check_forward_rows(p, y_host, oracle_rows(p, limit));
}

ForwardCheck check_forward_rows(Problem& p, const void* y_host, const std::vector<int64_t>& rows) {
  const reference::Weights w = reference::from_weights(p.weights());
  const reference::Matrix x = rows_of(p.x_view(), rows);
  const reference::Forward f = reference::ffn_forward(w, x);
  const reference::Matrix y =
      rows_of(TensorView::matrix(const_cast<void*>(y_host), p.spec.dtype, p.spec.m, p.spec.k), rows);
  ForwardCheck c;
  c.error = reference::rel_error(y, f.y);
  c.tolerance = tolerance(w, x, f, p.spec.dtype);
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
