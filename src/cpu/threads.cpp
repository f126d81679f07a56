#include "cpu/threads.hpp"

#include <cblas.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "twell/error.hpp"
#include "twell/threads.hpp"

namespace twell {

namespace {

std::atomic<int> g_setting{0};  // set_cpu_threads(); 0: automatic
std::atomic<int> g_last{0};     // the team of the last CPU call

// CPUs granted by a quota / period pair (0: no quota, or not readable).
int quota_cpus(double quota, double period) {
  if (!(quota > 0) || !(period > 0) || !std::isfinite(quota / period)) return 0;
  return int(std::min(std::ceil(quota / period), 1e6));
}

// The cgroup's CPU quota as this process sees it at /sys/fs/cgroup: v2's cpu.max ("max 100000"
// or "150000 100000"), else v1's cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us. Read once.
int cgroup_cpus() {
  static const int cpus = [] {
    std::ifstream v2("/sys/fs/cgroup/cpu.max");
    std::string quota;
    double period = 0;
    if (v2 >> quota >> period) return quota == "max" ? 0 : quota_cpus(std::atof(quota.c_str()), period);
    std::ifstream q("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), p("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    double us = 0;
    if (q >> us && p >> period) return quota_cpus(us, period);
    return 0;
  }();
  return cpus;
}

}  // namespace

int cpu_count() {
  int n = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) n = int(std::thread::hardware_concurrency());  // over 1024 CPUs, or no affinity call
  n = std::max(n, 1);
  const int quota = cgroup_cpus();
  return quota > 0 ? std::min(n, quota) : n;
}

void set_cpu_threads(int n) {
  if (n < 0)
    throw Error("set_cpu_threads", "n", ">= 0 (0: automatic)", std::to_string(n));
  g_setting.store(n);
}

int cpu_threads_setting() { return g_setting.load(); }

int cpu_threads() {
  const int want = g_setting.load();
  return std::clamp(want > 0 ? want : omp_get_max_threads(), 1, cpu_count());
}

int last_cpu_threads() { return g_last.load(); }

namespace cpu {

CallThreads::CallThreads()
    : threads_(cpu_threads()), saved_max_(omp_get_max_threads()), saved_dynamic_(omp_get_dynamic()) {
  if (saved_dynamic_) omp_set_dynamic(0);
  if (threads_ != saved_max_) omp_set_num_threads(threads_);
  // The pthread OpenBLAS keeps its own pool (openblas_get_parallel(): 1); the OpenMP one (2) reads
  // omp_get_max_threads() at each call, and setting it would change the caller's OpenMP count.
  if (openblas_get_parallel() == 1 && openblas_get_num_threads() != threads_)
    openblas_set_num_threads(threads_);
  g_last.store(threads_);
}

CallThreads::~CallThreads() {
  if (threads_ != saved_max_) omp_set_num_threads(saved_max_);
  if (saved_dynamic_) omp_set_dynamic(saved_dynamic_);
}

}  // namespace cpu

}  // namespace twell
