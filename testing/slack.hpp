// How far a correct fp32-accumulating implementation may land from the fp64 oracle when the
// problem is ill-conditioned: an absolute slack per output, added to the relative tolerances of
// docs/testing.md (which model rounding to the stored dtype, not cancellation).
//
// Two effects, both present in any fp32 GEMM (cuBLAS's dense layer included):
//  - Summation noise. A dot product of length L accumulated in fp32 is off by up to about
//    4 sqrt(L) roundoffs of sum |terms| (a probabilistic bound). Where the terms cancel (a gate
//    value of 6e-4 out of terms summing to 3.9 in magnitude), that is a large relative error of
//    the value and of everything computed from it; with one active unit in a row it is the whole
//    row's relative error.
//  - Mask flips. A gate value within that noise of zero may come out either sign; a flipped mask
//    moves the first weight's gradient and dx by a whole term (dh + l1/M) * u, not by a rounding.
// Each slack is a Frobenius-norm bound of what these can change, propagated to first order through
// the layer; `entries` counts the gate values within noise of zero.
#pragma once
#include <cstdint>

#include "twell/reference.hpp"

namespace twell::testing {

struct Fp32Slack {
  double y = 0;        // the forward output
  double dx = 0;       // the input gradient
  double dfirst = 0;   // the first weight's gradient (gate, or up in a plain FFN)
  double dsecond = 0;  // the up weight's gradient of a gated FFN
  double ddown = 0;    // the down weight's gradient
  int64_t entries = 0;
};

// `dy` with no rows: the forward slack only (the gradient fields stay 0).
Fp32Slack fp32_slack(const reference::Weights& w, const reference::Matrix& x, const reference::Matrix& dy,
                     const reference::Forward& f, double l1_coef);

// A relative tolerance plus an absolute slack relative to the reference's norm.
double with_slack(double relative_tolerance, double abs_slack, const reference::Matrix& ref);

}  // namespace twell::testing
