// Checking a forward output against the fp64 oracle, with the tolerance rule of docs/testing.md.
// Shared by the tests and the benchmark harness (which reports the error of every row it times).
#pragma once
#include <cstdint>
#include <vector>

#include "twell/reference.hpp"
#include "slack.hpp"
#include "workload.hpp"

namespace twell::testing {

// The rows the oracle is evaluated on: all of them up to `limit`, else a spread sample plus every
// special row. Forward rows are independent, so a row sample is an exact check of those rows.
std::vector<int64_t> oracle_rows(const Problem& p, int64_t limit = 512);
// The given rows of a host [R, C] tensor, converted to fp64 (only those rows are read, so a sample
// of a tensor of billions of elements stays cheap).
reference::Matrix rows_of(const TensorView& t, const std::vector<int64_t>& rows);
// oracle_rows(p, limit) plus the rows on either side of every 2^31 and 2^32 element (and byte)
// boundary of a [M, W] matrix, for each row width W in `widths`: where a 32-bit index or offset
// would wrap.
std::vector<int64_t> boundary_rows(const Problem& p, const std::vector<int64_t>& widths, int64_t limit);

// Tolerance of a fast path on dtype t: 2x the relative error of a plain dense implementation in t
// (each GEMM output, h and y rounded to t), plus a floor for summation-order noise, plus the fp32
// slack of an ill-conditioned problem (slack.hpp).
// f: the oracle's forward of x (its y the reference).
double tolerance(const reference::Weights& w, const reference::Matrix& x, const reference::Forward& f, DType t);

struct ForwardCheck {
  double error = 0;             // ||y - y_ref|| / ||y_ref|| over the checked rows
  double tolerance = 0;
  bool zero_rows_exact = true;  // rows whose reference is exactly zero are exactly zero
  bool ok() const { return error <= tolerance && zero_rows_exact; }
};
// Compares y (host, in p.spec.dtype, [M, K]) against the oracle on oracle_rows(p, limit).
ForwardCheck check_forward(Problem& p, const void* y_host, int64_t limit = 512);
// The same on the given rows.
ForwardCheck check_forward_rows(Problem& p, const void* y_host, const std::vector<int64_t>& rows);

}  // namespace twell::testing
