// Shared test helpers: problems, the oracle check (testing/check.hpp), seeds, poisoning.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "check.hpp"
#include "twell/reference.hpp"
#include "twell/twell.hpp"
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
// Empty buffers (a null data() among them) are left alone.
inline void poison(void* p, size_t bytes) {
  if (bytes > 0) std::memset(p, 0xff, bytes);
}

// Runs fn, expects an Error whose argument is `arg` and whose message mentions `needle`.
template <class F>
void expect_named_error(F&& fn, const std::string& arg, const std::string& needle = "") {
  try {
    fn();
    ADD_FAILURE() << "expected twell::Error naming " << arg;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), arg) << e.what();
    if (!needle.empty()) EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

using testing::check_forward;
using testing::ForwardCheck;
using testing::tolerance;

}  // namespace twell::test
