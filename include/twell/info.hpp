// Build and runtime information: version, compiled backends, visible devices.
#pragma once
#include <string>
#include <vector>

namespace twell {

const char* version();
bool cuda_compiled();             // the CUDA backend is part of this build
int cuda_device_count();          // 0 without CUDA or without a device
std::vector<std::string> cuda_devices();  // "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)"
std::string cpu_description();    // model name, threads, BLAS

}  // namespace twell
