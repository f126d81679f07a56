// Kernel launches chained by programmatic dependent launch (PDL, sm_90 and newer).
//
// Every kernel of the CUDA backend starts with chain_entry(): it waits until the kernel before it
// on the stream has completed and its writes are visible (griddepcontrol.wait), then lets the
// next kernel's launch begin (griddepcontrol.launch_dependents). launch() asks for that overlap
// (cudaLaunchAttributeProgrammaticStreamSerialization) on sm_90 and newer, so a kernel's CTAs
// are set up on the SMs its predecessor frees in its tail, and start at once when it completes,
// instead of after a launch gap. No kernel touches memory before its wait, so the stream order is
// unchanged: each kernel still sees everything every earlier kernel wrote (each waits for its
// predecessor, which waited for its own). After a memset or a cuBLAS kernel the kernel starts once
// that has completed (or, if the cuBLAS kernel releases its dependents early, waits for it here);
// on older GPUs, or with TWELL_NO_PDL=1 in the environment, launches are plain and the wait
// returns at once.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda/runtime/device.hpp"

namespace twell::gpu {

__device__ __forceinline__ void chain_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The entry of a kernel that starts while the kernel before it still runs (the overlapped row
// stage): it lets the next kernel's launch begin but does not wait; it reads what its predecessor
// writes only after acquiring that predecessor's per-block releases. Its predecessor ran
// chain_entry() first, so everything before that predecessor is complete and visible.
__device__ __forceinline__ void chain_without_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The launch configuration of kernel<<<grid, block, smem, s>>> with at most one attribute.
inline cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                        cudaLaunchAttribute* attribute) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = s;
  if (attribute != nullptr) {
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return config;
}

// kernel<<<grid, block, smem, s>>>(args...), chained when chained_launches(). Errors surface
// through check_launch (cudaGetLastError), as for <<<>>>.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchAttribute chain{};
  chain.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  chain.val.programmaticStreamSerializationAllowed = 1;
  const cudaLaunchConfig_t config = launch_config(grid, block, smem, s, chained_launches() ? &chain : nullptr);
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// kernel<<<grid, block, smem, s>>>(args...) as a cooperative launch: the launch fails unless every
// CTA of the grid can be resident at once (a kernel with a grid barrier). Not chained: it starts
// once the work before it has completed. Returns the launch's status (cudaErrorCooperativeLaunchTooLarge
// where fewer SMs are available than the grid was sized for, e.g. under MPS limits).
template <typename... Params, typename... Args>
cudaError_t launch_cooperative(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                               Args&&... args) {
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  const cudaLaunchConfig_t config = launch_config(grid, block, smem, s, &cooperative);
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace twell::gpu
