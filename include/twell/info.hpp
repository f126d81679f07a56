// Build and runtime information: version, compiled backends, visible devices.
#pragma once
#include <string>
#include <vector>

namespace twell {

const char* version();
bool cuda_compiled();             // the CUDA backend is part of this build
int cuda_device_count();          // 0 without CUDA or without a device
std::vector<std::string> cuda_devices();  // "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)"
std::string cpu_description();    // model name, threads, BLAS and its kernel set, oneDNN where used
// OpenBLAS's kernel set in this process ("SkylakeX", "Haswell", "Prescott", ...): chosen when
// OpenBLAS loads, from the CPU it recognises or OPENBLAS_CORETYPE.
std::string blas_core();
// The set for this CPU's vector units: "SkylakeX" (AVX-512 F, BW, VL, DQ, CD), "Zen" (AMD) or
// "Haswell" (AVX2 and FMA), else "" (OpenBLAS's own detection).
std::string blas_core_for_cpu();
// Where OpenBLAS runs a set without AVX2 on a CPU that has AVX2 or AVX-512 (a CPU its build does
// not recognise: up to ~5x slower CPU GEMMs), what to do about it; else "".
std::string blas_core_advice();
// The advice for OpenBLAS running `core` where this CPU wants `want` (blas_core_for_cpu()) and
// OPENBLAS_CORETYPE holds `set` ("" unset): "" where `core` has AVX2 kernels or `want` is "".
std::string blas_core_advice_for(const std::string& core, const std::string& want, const std::string& set);

}  // namespace twell
