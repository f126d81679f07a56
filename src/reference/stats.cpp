// Activation statistics of the oracle: L0, L1 (paper normalisation) and dead neurons.
#include <algorithm>
#include <cmath>

#include "twell/reference.hpp"

namespace twell::reference {

double l0_per_token(const Forward& f) {
  if (f.gate_pre.rows == 0) return 0;
  int64_t active = 0;
  for (double v : f.gate_pre.v) active += relu_active(v);
  return double(active) / double(f.gate_pre.rows);
}

double l1_per_token(const Forward& f) {
  if (f.h.rows == 0) return 0;
  double s = 0;
  for (double v : f.h.v) s += std::fabs(v);
  return s / double(f.h.rows);
}

void DeadNeuronTracker::observe(const Forward& f) {
  for (int64_t m = 0; m < f.gate_pre.rows; ++m)
    for (int64_t n = 0; n < f.gate_pre.cols && n < int64_t(hits_.size()); ++n)
      hits_[size_t(n)] += relu_active(f.gate_pre.at(m, n));
  tokens_ += f.gate_pre.rows;
}

int64_t DeadNeuronTracker::dead() const {
  int64_t d = 0;
  for (int64_t h : hits_) d += h == 0;
  return d;
}

double DeadNeuronTracker::dead_fraction() const {
  return hits_.empty() ? 0.0 : double(dead()) / double(hits_.size());
}

void DeadNeuronTracker::reset() {
  std::fill(hits_.begin(), hits_.end(), 0);
  tokens_ = 0;
}

}  // namespace twell::reference
