// Threads of the CPU backend. Each CPU call (InferencePlan::run, TrainingPlan::forward and
// backward on host memory) runs its OpenMP loops and OpenBLAS GEMMs on one team of cpu_threads()
// threads, never more than cpu_count(), with OpenMP's dynamic adjustment off for the call (OpenBLAS's
// OpenMP GEMMs wait for every thread they asked for; under OMP_DYNAMIC a smaller team never
// finishes). The calling thread's OpenMP settings are restored when the call returns.
#pragma once

namespace twell {

// n >= 1: every CPU call runs min(n, cpu_count()) threads. 0 (the default): the calling thread's
// OpenMP count (omp_get_max_threads(): OMP_NUM_THREADS, omp_set_num_threads(), and so
// torch.set_num_threads() where torch shares twell's OpenMP runtime), at most cpu_count().
// Process-wide; n < 0 throws twell::Error. twell.torch sets it to torch.get_num_threads().
void set_cpu_threads(int n);
int cpu_threads_setting();  // what set_cpu_threads() set (0: automatic)
int cpu_threads();          // the threads a CPU call from this thread runs now
int last_cpu_threads();     // the threads the last CPU call ran (0: none yet)
// CPUs this process may run on: its affinity mask (sched_getaffinity), within its cgroup v2
// cpu.max quota (rounded up).
int cpu_count();

}  // namespace twell
