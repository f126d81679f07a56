// Shared test helpers: problems, the oracle check (testing/check.hpp), seeds, poisoning.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "twell/reference.hpp"
#include "twell/twell.hpp"
#include "check.hpp"
#include "workload.hpp"

namespace twell::test {

namespace ref = twell::reference;
using testing::Pattern;
using testing::Problem;
using testing::ProblemSpec;

// One seed per test process (TWELL_SEED overrides); every problem derives from it plus a salt.
inline uint64_t session() {
  static const uint64_t base = testing::session_seed();
  return base;
}
inline uint64_t seed(uint64_t salt) {
  return salt == 0 ? session() : session() * 6364136223846793005ull + salt * 1442695040888963407ull;
}

// Fills a buffer with a NaN bit pattern so unwritten outputs fail every comparison.
inline void poison(void* p, size_t bytes) { std::memset(p, 0xff, bytes); }

using testing::check_forward;
using testing::ForwardCheck;
using testing::tolerance;

}  // namespace twell::test
