// The CPU backend's thread team for one call (twell/threads.hpp says what it follows).
#pragma once

namespace twell::cpu {

// For the scope of one CPU call: the calling thread's OpenMP count set to cpu_threads() (twell's
// loops and the OpenMP OpenBLAS, which reads omp_get_max_threads() at each GEMM, follow it; the
// pthread OpenBLAS is set to it too), dynamic adjustment off; both restored on exit.
class CallThreads {
 public:
  CallThreads();
  ~CallThreads();
  CallThreads(const CallThreads&) = delete;
  CallThreads& operator=(const CallThreads&) = delete;
  int threads() const { return threads_; }

 private:
  int threads_, saved_max_, saved_dynamic_;
};

}  // namespace twell::cpu
