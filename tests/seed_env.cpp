// Prints the session seed once per test process, so any failure can be replayed with TWELL_SEED.
#include "common.hpp"

namespace twell::test {
namespace {

class SeedEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    std::printf("twell test seed: TWELL_SEED=%llu (set it to replay this run)\n",
                static_cast<unsigned long long>(session()));
  }
};

const auto* const kRegistered = ::testing::AddGlobalTestEnvironment(new SeedEnvironment);

}  // namespace
}  // namespace twell::test
