#include "twell/info.hpp"

#include <cblas.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "cpu/onednn.hpp"

#ifdef TWELL_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace twell {

const char* version() { return TWELL_VERSION; }

bool cuda_compiled() {
#ifdef TWELL_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef TWELL_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

std::vector<std::string> cuda_devices() {
  std::vector<std::string> out;
#ifdef TWELL_WITH_CUDA
  for (int i = 0; i < cuda_device_count(); ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back(std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) +
                  ", " + std::to_string(p.multiProcessorCount) + " SMs, " +
                  std::to_string(p.totalGlobalMem >> 30) + " GiB)");
  }
#endif
  return out;
}

std::string cpu_description() {
  std::string model = "unknown CPU";
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " threads, OpenBLAS (" +
         blas_core() + " kernels)" + (cpu::bf16_gemm_available() ? ", oneDNN bf16 GEMMs" : "");
}

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}

std::string blas_core_for_cpu() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
#endif
  return "";
}

std::string blas_core_advice() {
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  return blas_core_advice_for(blas_core(), blas_core_for_cpu(), set != nullptr ? set : "");
}

std::string blas_core_advice_for(const std::string& core, const std::string& want, const std::string& set) {
  if (want.empty()) return "";
  // OpenBLAS's x86-64 sets without AVX2 kernels.
  for (const char* old : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge",
                          "Opteron", "Opteron_SSE3", "Barcelona", "Bobcat", "Bulldozer", "Piledriver",
                          "Nano", "Katmai", "Coppermine", "Northwood", "Banias"})
    if (core == old) {
      const std::string units = want == "SkylakeX" ? "AVX-512" : "AVX2";
      if (!set.empty())
        return "OpenBLAS runs its " + core + " kernels on a CPU with " + units + " although " +
               "OPENBLAS_CORETYPE=" + set + ": set OPENBLAS_CORETYPE=" + want +
               " (or unset it) for up to ~5x faster CPU GEMMs, where this OpenBLAS chooses kernels at run time";
      return "OpenBLAS runs its " + core + " kernels on a CPU with " + units +
             " (a CPU it does not recognise): set OPENBLAS_CORETYPE=" + want +
             " before the process starts for up to ~5x faster CPU GEMMs";
    }
  return "";
}

}  // namespace twell
