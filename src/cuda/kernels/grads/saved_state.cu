// The saved training state's trust boundary on the device: forward seals the buffer with its
// header, backward checks the whole buffer before any kernel indexes with it. The host cannot read
// the buffer without a synchronisation, so a fault is reported through the plan's flag and the
// buffer is emptied (no compact entry, no routed row) so that the kernels after the check route
// nothing out of bounds.
//   header:   one thread stores the header passed by value (forward's last kernel).
//   check:    warp per row (grid-stride): lane 0 the row's slot against the routed list; lanes over
//             the row's tiles, each its count (<= capacity) and its columns (strictly ascending,
//             inside the tile and the matrix); compact rows only, a routed row's entries are void.
//             Threads over the routed list: each routed row's slot points back at it. Thread 0:
//             the header against the expected one. The first fault wins the flag's code (CAS).
//   sanitize: grid-stride over rows, returns unless flagged: counts 0, row_slot -1, num_routed 0;
//             thread 0 copies the fault into the host-mapped report (the first unreported one).
#include <algorithm>

#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/training.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int kBlocksPerSm = 8;  // enough warps to keep the count and column loads in flight
static_assert(kThreads % kWarpSize == 0, "whole warps");
static_assert(sizeof(TwellHeader) % sizeof(unsigned long long) == 0, "the header compares as words");

__device__ void raise_fault(SavedFault* flag, SavedFaultCode code, int64_t row, int64_t value) {
  if (atomicCAS(&flag->code, 0, int32_t(code)) == 0) {
    flag->row = row;
    flag->value = value;
  }
}

__device__ __forceinline__ int64_t tiles_of(const TwellShape& shape) {
  return (shape.cols + shape.tile - 1) / shape.tile;
}

__global__ void __launch_bounds__(1) header_kernel(TwellHeader* dst, TwellHeader value) {
  chain_entry();
  *dst = value;
}

__global__ void __launch_bounds__(kThreads)
    check_kernel(TwellView tw, TwellHeader expected, SavedFault* flag) {
  chain_entry();
  const int64_t rows = tw.shape.rows, nt = tiles_of(tw.shape), cols = tw.shape.cols;
  const int64_t tile = tw.shape.tile, capacity = tw.shape.capacity;
  const int64_t thread = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t threads = int64_t(gridDim.x) * kThreads;
  if (thread == 0) {
    const auto* got = reinterpret_cast<const unsigned long long*>(tw.header);
    const auto* want = reinterpret_cast<const unsigned long long*>(&expected);
    for (size_t i = 0; i < sizeof(TwellHeader) / sizeof(unsigned long long); ++i)
      if (got[i] != want[i]) raise_fault(flag, SavedFaultCode::header, -1, int64_t(i));
  }
  const int32_t routed = *tw.num_routed;
  if (routed < 0 || routed > rows) {
    if (thread == 0) raise_fault(flag, SavedFaultCode::num_routed, -1, routed);
    return;
  }
  for (int64_t s = thread; s < routed; s += threads) {
    const int32_t r = tw.routed_rows[s];
    if (r < 0 || r >= rows || tw.row_slot[r] != s) raise_fault(flag, SavedFaultCode::routed_rows, r, s);
  }
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize; r < rows; r += warps) {
    const int32_t slot = tw.row_slot[r];
    if (slot >= 0) {
      if (lane == 0 && (slot >= routed || tw.routed_rows[slot] != r))
        raise_fault(flag, SavedFaultCode::row_slot, r, slot);
      continue;
    }
    if (slot != -1) {
      if (lane == 0) raise_fault(flag, SavedFaultCode::row_slot, r, slot);
      continue;
    }
    for (int64_t t = lane; t < nt; t += kWarpSize) {
      const int64_t count = tw.counts[r * nt + t];
      if (count > capacity) {
        raise_fault(flag, SavedFaultCode::count, r, count);
        continue;
      }
      const int64_t width = min(tile, cols - t * tile);  // the last tile may be partial
      const uint16_t* c = tw.cols + (r * nt + t) * capacity;
      int64_t previous = -1;
      for (int64_t e = 0; e < count; ++e) {
        const int64_t col = c[e];
        if (col <= previous || col >= width) {
          raise_fault(flag, SavedFaultCode::column, r, t * tile + col);
          break;
        }
        previous = col;
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    sanitize_kernel(TwellView tw, const SavedFault* flag, volatile SavedFault* report) {
  chain_entry();
  const SavedFault fault = *flag;
  if (fault.code == 0) return;
  const int64_t rows = tw.shape.rows, nt = tiles_of(tw.shape);
  const int64_t thread = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t threads = int64_t(gridDim.x) * kThreads;
  for (int64_t r = thread; r < rows; r += threads) tw.row_slot[r] = -1;
  for (int64_t i = thread; i < rows * nt; i += threads) tw.counts[i] = 0;
  if (thread == 0) {
    *tw.num_routed = 0;
    if (report->code == 0) {
      report->row = fault.row;
      report->value = fault.value;
      __threadfence_system();
      report->code = fault.code;
    }
  }
}

int blocks_for(int64_t work_items, int per_block, const DeviceInfo& dev) {
  const int64_t wanted = (work_items + per_block - 1) / per_block;
  return int(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(dev.sm_count) * kBlocksPerSm)));
}

}  // namespace

void launch_write_header(TwellHeader* dst, const TwellHeader& value, cudaStream_t s, const char* op) {
  launch(header_kernel, dim3(1), dim3(1), 0, s, dst, value);
  check_launch(op, "saved-state header kernel");
}

void launch_saved_check(const SavedCheckArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const char* op = "TrainingPlan::backward";
  check_cuda(cudaMemsetAsync(a.flag, 0, sizeof(SavedFault), s), op, "saved-state fault flag");
  const int64_t rows = a.saved.shape.rows;
  launch(check_kernel, dim3(blocks_for(rows, kWarpsPerBlock, dev)), dim3(kThreads), 0, s, a.saved,
         a.expected, a.flag);
  check_launch(op, "saved-state check kernel");
  launch(sanitize_kernel, dim3(blocks_for(rows * a.saved.shape.num_tiles(), kThreads, dev)), dim3(kThreads), 0,
         s, a.saved, static_cast<const SavedFault*>(a.flag), static_cast<volatile SavedFault*>(a.report));
  check_launch(op, "saved-state sanitize kernel");
}

}  // namespace twell::gpu
