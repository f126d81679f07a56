// Shared test helpers: problems, the oracle, the tolerance rule of docs/testing.md, poisoning.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "twell/reference.hpp"
#include "twell/twell.hpp"
#include "workload.hpp"

namespace twell::test {

namespace ref = twell::reference;
using testing::Pattern;
using testing::Problem;
using testing::ProblemSpec;

// One seed per test process (TWELL_SEED overrides); every problem derives from it plus a salt.
inline uint64_t seed(uint64_t salt) {
  static const uint64_t base = testing::session_seed();
  return base * 6364136223846793005ull + salt * 1442695040888963407ull + 1;
}

// Fills a buffer with a NaN bit pattern so unwritten outputs fail every comparison.
inline void poison(void* p, size_t bytes) { std::memset(p, 0xff, bytes); }

// The rows the oracle is evaluated on: all of them up to `limit`, else a spread sample plus every
// special row. Forward rows are independent, so a row sample is an exact check of those rows.
std::vector<int64_t> oracle_rows(const Problem& p, int64_t limit = 512);
ref::Matrix take_rows(const ref::Matrix& a, const std::vector<int64_t>& rows);

// Tolerance of a fast path on dtype t: 2x the relative error of a plain dense implementation in t
// (each GEMM output, h and y rounded to t) plus a floor for summation-order noise.
double tolerance(const ref::Weights& w, const ref::Matrix& x, const ref::Matrix& y_ref, DType t);

struct ForwardCheck {
  double error = 0;      // ||y - y_ref|| / ||y_ref|| over the checked rows
  double tolerance = 0;
  bool zero_rows_exact = true;  // rows whose reference is exactly zero are exactly zero
};
// Compares y (host, in p.spec.dtype, [M, K]) against the oracle on oracle_rows(p).
ForwardCheck check_forward(Problem& p, const void* y_host);

}  // namespace twell::test
