#include "twell/info.hpp"

#include <fstream>
#include <string>
#include <thread>

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
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " threads, OpenBLAS";
}

}  // namespace twell
