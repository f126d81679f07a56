// The CPU backend's threads (twell/threads.hpp): what a call runs, what it follows, that it never
// runs more than the CPUs the process may use, and that the caller's OpenMP settings survive.
#include <omp.h>
#include <sched.h>

#include <thread>

#include "common.hpp"
#include "cpu/threads.hpp"

namespace twell::test {
namespace {

class CpuThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_max_ = omp_get_max_threads();
    problem_ = testing::make_problem({FfnKind::gated, 300, 64, 520, DType::f32, Pattern::uniform, 0.05, 256, seed(90)});
  }
  void TearDown() override {
    set_cpu_threads(0);
    omp_set_num_threads(saved_max_);
    omp_set_dynamic(0);
  }
  // One inference call; returns the threads it ran.
  int infer() {
    std::vector<float> y(size_t(300 * 64));
    InferencePlan plan(problem_.weights());
    plan.run({problem_.x_view(), TensorView::matrix(y.data(), DType::f32, 300, 64), {}});
    const ForwardCheck chk = check_forward(problem_, y.data());
    EXPECT_LE(chk.error, chk.tolerance);
    return last_cpu_threads();
  }
  int saved_max_ = 1;
  Problem problem_;
};

TEST_F(CpuThreads, FixedCountIsRunAndTheCallersSettingsRestored) {
  EXPECT_GE(cpu_count(), 1);
  EXPECT_LE(cpu_count(), int(std::max(1u, std::thread::hardware_concurrency())));
  omp_set_num_threads(3);
  omp_set_dynamic(1);  // OpenBLAS's OpenMP GEMMs hang under it: off for the call, then restored
  set_cpu_threads(1);
  EXPECT_EQ(cpu_threads_setting(), 1);
  EXPECT_EQ(cpu_threads(), 1);
  EXPECT_EQ(infer(), 1);
  EXPECT_EQ(omp_get_max_threads(), 3);
  EXPECT_TRUE(omp_get_dynamic());
  set_cpu_threads(1000);  // never more than the CPUs
  EXPECT_EQ(infer(), cpu_count());
  EXPECT_EQ(omp_get_max_threads(), 3);
}

TEST_F(CpuThreads, AutomaticFollowsTheCallersOpenMpCount) {
  set_cpu_threads(0);
  omp_set_num_threads(1);
  EXPECT_EQ(infer(), 1);
  omp_set_num_threads(cpu_count());
  EXPECT_EQ(infer(), cpu_count());
  omp_set_num_threads(cpu_count() + 7);  // OMP_NUM_THREADS above the cores: capped
  EXPECT_EQ(cpu_threads(), cpu_count());
  EXPECT_EQ(infer(), cpu_count());
  EXPECT_EQ(omp_get_max_threads(), cpu_count() + 7);
}

TEST_F(CpuThreads, TrainingCallsRunTheCount) {
  TrainingPlan plan(problem_.weights());
  SavedActivations saved;
  std::vector<float> y(300 * 64), dx(300 * 64), g(520 * 64), u(520 * 64), d(520 * 64);
  auto mat = [](auto& v, int64_t r, int64_t c) { return TensorView::matrix(v.data(), DType::f32, r, c); };
  set_cpu_threads(1);
  plan.forward({problem_.x_view(), mat(y, 300, 64), {}}, saved);
  EXPECT_EQ(last_cpu_threads(), 1);
  set_cpu_threads(cpu_count());
  plan.backward({problem_.x_view(), mat(dx, 300, 64), mat(g, 520, 64), mat(u, 520, 64), mat(d, 520, 64)},
                saved);
  EXPECT_EQ(last_cpu_threads(), cpu_count());
}

// Inside a call's scope a parallel region gets exactly the team the call records, with dynamic
// adjustment off (it would let the runtime hand OpenBLAS's GEMM fewer threads than it waits for).
TEST_F(CpuThreads, CallScopeTeamAndDynamicOff) {
  omp_set_dynamic(1);
  for (int n : {1, std::min(2, cpu_count())}) {
    set_cpu_threads(n);
    int team = 0;
    {
      const cpu::CallThreads call;
      EXPECT_EQ(call.threads(), n);
      EXPECT_FALSE(omp_get_dynamic());
#pragma omp parallel
      {
#pragma omp single
        team = omp_get_num_threads();
      }
    }
    EXPECT_EQ(team, n);
    EXPECT_EQ(last_cpu_threads(), n);
    EXPECT_TRUE(omp_get_dynamic());
  }
}

// A process pinned to one CPU (taskset -c 0) runs one thread whatever it asks for.
TEST_F(CpuThreads, AffinityCapsTheCount) {
  cpu_set_t old, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof old, &old), 0);
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &old)) ++first;
  ASSERT_LT(first, CPU_SETSIZE);
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  EXPECT_EQ(cpu_count(), 1);
  set_cpu_threads(4);
  const int ran = infer();
  omp_set_num_threads(4);
  set_cpu_threads(0);
  const int automatic = infer();
  ASSERT_EQ(sched_setaffinity(0, sizeof old, &old), 0);
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(automatic, 1);
}

TEST_F(CpuThreads, NegativeCountRefused) {
  expect_named_error([] { set_cpu_threads(-1); }, "n", ">= 0");
  EXPECT_EQ(cpu_threads_setting(), 0);
}

// OpenBLAS's kernel set is named in the CPU description; advice, where given, names the variable
// that fixes it and a set with AVX2.
TEST(CpuInfo, BlasCoreAndAdvice) {
  const std::string core = blas_core();
  EXPECT_FALSE(core.empty());
  EXPECT_NE(cpu_description().find("OpenBLAS (" + core + " kernels)"), std::string::npos) << cpu_description();
  const std::string advice = blas_core_advice();
  if (!advice.empty()) {
    EXPECT_NE(advice.find("OPENBLAS_CORETYPE="), std::string::npos) << advice;
    EXPECT_NE(advice.find(core), std::string::npos) << advice;
  }
  // The rule itself: advice only for a set without AVX2 kernels on a CPU that has them.
  EXPECT_NE(blas_core_advice_for("Prescott", "SkylakeX", "").find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos);
  EXPECT_NE(blas_core_advice_for("Nehalem", "Haswell", "").find("AVX2"), std::string::npos);
  EXPECT_NE(blas_core_advice_for("Prescott", "Zen", "Zen").find("although OPENBLAS_CORETYPE=Zen"), std::string::npos);
  EXPECT_EQ(blas_core_advice_for("SkylakeX", "SkylakeX", ""), "");
  EXPECT_EQ(blas_core_advice_for("Haswell", "SkylakeX", ""), "");
  EXPECT_EQ(blas_core_advice_for("Prescott", "", ""), "");
  const std::string want = blas_core_for_cpu();
  EXPECT_TRUE(want.empty() || want == "SkylakeX" || want == "Haswell" || want == "Zen") << want;
}

}  // namespace
}  // namespace twell::test
