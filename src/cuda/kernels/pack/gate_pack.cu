// Fused gate GEMM + ReLU + TwELL pack for Hopper (sm_90a): G = relu(x W1^T) is packed from the
// GEMM's output tiles in shared memory; only (row, tile)s that overflow the capacity reach G.
//   grid: persistent clusters of 2 CTAs (one per SM); a cluster walks pairs of 128-row blocks x
//         one 256-column block, the column blocks of a row block consecutively (the CTAs in
//         flight share a few x row blocks and W1 in L2).
//   CTA: 3 warpgroups. Warpgroup 0, lane 0 of warp 0: TMA loads of x [128 x 64] and of half of
//        W1's [256 x 64] slice, that half multicast to both CTAs of the cluster, into a ring of
//        kStages buffers (128-byte swizzle) paced by full / empty mbarriers (a stage is released
//        to both CTAs' producers). Warpgroups 1 and 2: rows 0-63 and 64-127 of the tile,
//        wgmma m64n256k16 into 128 fp32 registers per thread.
//   epilogue: each consumer warpgroup rounds relu(acc) to T into its own staging buffer, hands
//        it over (mbarrier) and starts its next tile; warps 1-3 of warpgroup 0 (the packers) take
//        it meanwhile: warps 1 and 2 pack it, one of the 64 staged rows per lane (pack_staged);
//        warp 3 holds no row and only takes part in the hand-over barriers and ready counts.
//        A (row, tile) with more active values than the capacity, or with a NaN or infinite one,
//        writes its dense values to G instead, with count kOverflowCount and row_slot
//        kOverflowRow; the caller's launch_route_overflow (pack.cu) routes those rows afterwards. The ReLU keeps NaN (max.NaN) and, for the packers, -Inf.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/sm90.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/inference.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

using Cfg = GatePackConfig;
constexpr int kThreads = 3 * 128;  // producer + 2 consumer warpgroups
constexpr int kMaxDevices = 64;
constexpr int kPackerWarps = 3;  // warps 1-3 of warpgroup 0 (warp 0's lane 0 issues the loads);
                                 // the 64 staged rows go to the first two, one per lane
constexpr uint32_t kABytes = Cfg::kBlockM * Cfg::kBlockK * 2;
constexpr uint32_t kBBytes = Cfg::kBlockN * Cfg::kBlockK * 2;
constexpr uint32_t kStageBytes = kABytes + kBBytes;
constexpr uint32_t kStagingBytes = 64 * Cfg::kBlockN * 2;  // per warpgroup: its 64 rows of G, 16-bit
constexpr size_t kSmemBytes = size_t(Cfg::kStages) * kStageBytes + 2 * kStagingBytes + 1024;  // + alignment
constexpr uint32_t kKRowBytes = Cfg::kBlockK * 2;  // a row of a K slice: the swizzle width
static_assert(Cfg::kBlockM == 128 && Cfg::kBlockN == 256 && (Cfg::kBlockK == 32 || Cfg::kBlockK == 64),
              "the kernel is written for 2 x m64n256k16 warpgroups over 64- or 128-byte K rows");
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one Hopper CTA");

struct Params {
  int64_t m = 0, n = 0;
  int n_blocks = 0, k_blocks = 0, tiles = 0;
  FfnKind kind = FfnKind::gated;
  TwellView out;
  uint16_t* hidden = nullptr;  // G [m, n]: dense values of overflowing (row, tile)s only
  unsigned long long* active = nullptr;
  int32_t* ready = nullptr;  // overlap: per 128-row block, +1 per packer warp and column block
};

#if TWELL_SM90A_DEVICE
constexpr int kConsumerWarps = 8;
constexpr int kPackers = kPackerWarps * 32;
constexpr int kClusterSize = GatePackConfig::kClusterM;
constexpr int kRowBytes = Cfg::kBlockN * 2;  // a staged row: 32 chunks of 16 bytes

// Byte offset of the 4-byte pair at (row, column 8 chunk + 2 q) of the staging buffer: 16-byte
// chunks XOR-swizzled by row % 8, so the 8 rows x 4 pairs a warp stores hit 32 banks.
__device__ __forceinline__ uint32_t staged_offset(int row, int chunk) {
  return uint32_t(row * kRowBytes + ((chunk ^ (row % 8)) * 16));
}

template <typename T>
__device__ __forceinline__ typename Elem<T>::Pair pair_of_bits(uint32_t bits) {
  typename Elem<T>::Pair p;
  memcpy(&p, &bits, sizeof p);
  return p;
}
template <typename T>
__device__ __forceinline__ uint32_t bits_of_pair(typename Elem<T>::Pair p) {
  uint32_t bits;
  memcpy(&bits, &p, sizeof bits);
  return bits;
}

// relu(a), relu(b) rounded to T: NaN stays NaN (max.NaN; fmaxf would give 0), and -Inf stays -Inf
// so that the packer routes its row (pack_staged).
template <typename T>
__device__ __forceinline__ uint32_t round_relu_pair(float a, float b) {
  constexpr uint32_t kNegativeInf = uint32_t(negative_inf_bits(Elem<T>::kInfBits)) * 0x00010001u;
  const auto p = Elem<T>::from_float2(make_float2(a, b));
  const uint32_t relu = bits_of_pair<T>(__hmax2_nan(p, pair_of_bits<T>(0u)));
  const uint32_t keep = __heq2_mask(p, pair_of_bits<T>(kNegativeInf));
  return (relu & ~keep) | (kNegativeInf & keep);
}

// A staged 16-bit value as the dense backup reads it from G: -Inf becomes the ReLU's 0, or NaN
// in a gated layer (pack.cu, routed_relu: x's row is then not finite, and the dense 0 * u is NaN).
template <typename T>
__device__ __forceinline__ uint32_t backup_half(uint32_t bits, FfnKind kind) {
  if (bits != negative_inf_bits(Elem<T>::kInfBits)) return bits;
  return kind == FfnKind::gated ? quiet_nan_bits(Elem<T>::kInfBits) : 0u;
}
template <typename T>
__device__ __forceinline__ uint4 backup_values(const uint4& v, FfnKind kind) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    out[i] = backup_half<T>(w[i] & 0xffffu, kind) | backup_half<T>(w[i] >> 16, kind) << 16;
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Consumer side of the epilogue: relu(acc) rounded to T into the staging buffer. Accumulator
// i * 4 + 2 h + b holds (row 16 warp + lane / 4 + 8 h, column 8 i + 2 (lane % 4) + b).
template <typename T>
__device__ __forceinline__ void stage_rows(const float (&acc)[128], uint32_t staging) {
  const int lane = threadIdx.x % kWarpSize, warp = (threadIdx.x / kWarpSize) % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = warp * 16 + lane / 4 + 8 * h;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const uint32_t v = round_relu_pair<T>(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(staging + staged_offset(row, i) + 4 * (lane % 4)),
                   "r"(v)
                   : "memory");
    }
  }
}

// Packer side: the 64 staged rows starting at global row row0 (columns n0 ..), one row per lane
// of the first two packer warps (warps 1 and 2; the third returns at once) (no cross-lane work: the packers issue few instructions beside the
// consumers' wgmmas). A first pass marks the row's non-zero 8-column chunks without branching;
// the second visits only those, in ascending order, so entries come out in ascending column
// order: the layout pack_twell gives. A (row, tile) over the capacity, or with a NaN or infinite
// value (-Inf too: not active, but with finite weights it means x's row is not finite), writes its
// dense values to G (backup_values) with count kOverflowCount and marks the row kOverflowRow.
template <typename T, int kTile>
__device__ __forceinline__ void pack_staged(uint32_t staging, int64_t row0, int64_t n0, const Params& p,
                                            unsigned long long& seen) {
  constexpr int kChunks = kTile / 8;  // 8-column chunks per TwELL tile
  static_assert(Cfg::kBlockN / 8 == 32, "a row's chunks are the bits of one word");
  const int r = (threadIdx.x / kWarpSize - 1) * kWarpSize + threadIdx.x % kWarpSize;
  const int64_t row = row0 + r;
  if (r >= 64 || row >= p.m) return;
  const TwellView& out = p.out;
  const int64_t num_tiles = (p.n + kTile - 1) / kTile;
  const int capacity = out.shape.capacity;
  auto* values = static_cast<uint16_t*>(out.values);
  const auto load = [&](int c) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(staging + staged_offset(r, c)));
    return v;
  };
  uint32_t chunks = 0;
#pragma unroll
  for (int c = 0; c < 32; ++c) {
    const uint4 v = load(c);
    chunks |= uint32_t(((v.x | v.y | v.z | v.w) & 0x7fff7fffu) != 0) << c;
  }
  // Only the chunks inside N: past it W1's rows are TMA's zero fill, and a row of x holding NaN or
  // Inf makes even x . 0 NaN there.
  if (p.n - n0 < Cfg::kBlockN) chunks &= (1u << ((p.n - n0) / 8)) - 1u;
#pragma unroll
  for (int t = 0; t < Cfg::kBlockN / kTile; ++t) {
    const int64_t tile = n0 / kTile + t;
    if (tile >= num_tiles) break;
    const int64_t slot = row * num_tiles + tile, base = slot * capacity;
    int count = 0;
    uint32_t max_magnitude = 0;  // of the tile's non-zero values: Inf's or more routes the tile
    for (uint32_t left = chunks >> (t * kChunks) & (kChunks == 32 ? ~0u : (1u << kChunks) - 1u); left != 0;
         left &= left - 1) {
      const int c = t * kChunks + __ffs(left) - 1;
      const uint4 v = load(c);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint16_t bits = uint16_t(w[e / 2] >> (16 * (e % 2)));
        const uint32_t magnitude = bits & kMagnitudeBits;
        if (magnitude == 0) continue;
        max_magnitude = max(max_magnitude, magnitude);
        if (count < capacity) {
          values[base + count] = bits;
          out.cols[base + count] = uint16_t(8 * c + e - t * kTile);
        }
        ++count;
      }
    }
    const bool nonfinite = max_magnitude >= Elem<T>::kInfBits;
    if (count <= capacity && !nonfinite) {
      seen += unsigned(count);
      out.counts[slot] = uint16_t(count);
      continue;
    }
    // Routed: the dense values go to G. Where a NaN or Inf routed the tile, its active entries are
    // counted again (the count above took -Inf too).
    int active = 0;
    for (int c = t * kChunks; c < (t + 1) * kChunks; ++c)
      if (n0 + 8 * c < p.n) {
        const uint4 v = load(c);
        if (nonfinite) active += active_count<T>(v);
        *reinterpret_cast<uint4*>(p.hidden + row * p.n + n0 + 8 * c) = backup_values<T>(v, p.kind);
      }
    seen += unsigned(nonfinite ? active : count);
    out.counts[slot] = kOverflowCount;
    out.row_slot[row] = kOverflowRow;
  }
}

// Adds the warp's non-zero count to *active (lane 0) and zeroes it.
__device__ __forceinline__ void flush_seen(unsigned long long& seen, unsigned long long* active) {
  warp_add_count(seen, active);
  seen = 0;
}

__device__ __forceinline__ void red_release_add(int32_t* counter, int32_t v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(counter), "r"(v) : "memory");
}
#endif  // TWELL_SM90A_DEVICE

#if TWELL_SM90A_DEVICE
// The kernel's shared state: the TMA ring's mbarriers (full / empty per stage), the staging
// buffers' hand-over mbarriers per consumer warpgroup g (0, 1; each arriving thread releases its
// own accesses: staged[g] completes when g's 128 threads have stored a tile's rows, freed[g] when
// the kPackers threads have read them), the buffers' shared addresses and the cluster walk.
struct Shared {
  uint64_t* full;
  uint64_t* empty;
  uint64_t* staged;
  uint64_t* freed;
  uint32_t a_base, b_base, staging;
  uint32_t rank, peer;
  int cluster, clusters;  // this cluster, and how many walk the tile pairs
  // The cluster's two CTAs take row blocks 2 mp and 2 mp + 1 of the same column block nb.
  __device__ void block_of(const Params& p, int pair, int& mb, int& nb) const {
    mb = (pair / p.n_blocks) * kClusterSize + int(rank);
    nb = pair % p.n_blocks;
  }
};

// Warp 0's lane 0: the TMA loads of each tile's K slices into the ring (x's rows; this CTA's half
// of W1's slice multicast to both CTAs).
__device__ __forceinline__ void load_tiles(const Shared& sh, const CUtensorMap* x_map, const CUtensorMap* w_map,
                                           const Params& p) {
  using namespace sm90;
  prefetch_map(x_map);
  prefetch_map(w_map);
  int stage = 0;
  uint32_t phase = 0;
  for (int pair = sh.cluster; pair < p.tiles; pair += sh.clusters) {
    int mb, nb;
    sh.block_of(p, pair, mb, nb);
    for (int kb = 0; kb < p.k_blocks; ++kb) {
      // Free in both CTAs: this one's half of W1's slice goes to both.
      barrier_wait(smem_addr(&sh.empty[stage]), phase ^ 1u);
      const uint32_t bar = smem_addr(&sh.full[stage]);
      barrier_arrive_expect(bar, kStageBytes);
      tma_load_2d(sh.a_base + stage * kABytes, x_map, bar, kb * Cfg::kBlockK, mb * Cfg::kBlockM);
      tma_load_2d_multicast(sh.b_base + stage * kBBytes + sh.rank * (kBBytes / 2), w_map, bar, kb * Cfg::kBlockK,
                            nb * Cfg::kBlockN + int(sh.rank) * (Cfg::kBlockN / 2),
                            uint16_t((1u << kClusterSize) - 1));
      if (++stage == Cfg::kStages) stage = 0, phase ^= 1u;
    }
  }
}

// Warps 1-3: each tile's two staged halves in turn, then (overlapped dots kernel) its release.
template <typename T, int kTile>
__device__ __forceinline__ void pack_tiles(const Shared& sh, const Params& p) {
  using namespace sm90;
  unsigned long long seen = 0;
  uint32_t parity = 0;
  for (int pair = sh.cluster; pair < p.tiles; pair += sh.clusters, parity ^= 1u) {
    int mb, nb;
    sh.block_of(p, pair, mb, nb);
    for (int g = 0; g < 2; ++g) {
      barrier_wait(smem_addr(&sh.staged[g]), parity);
      pack_staged<T, kTile>(sh.staging + g * kStagingBytes, int64_t(mb) * Cfg::kBlockM + g * 64,
                            int64_t(nb) * Cfg::kBlockN, p, seen);
      barrier_arrive(smem_addr(&sh.freed[g]));
    }
    if (p.ready != nullptr) {
      // Release the tile's rows to the overlapped dots kernel: this warp's count of non-zeros
      // first (nothing of the gate's is written after its last release), then its lanes' TwELL
      // entries, G values and row marks, ordered before lane 0's release by the warp barrier.
      flush_seen(seen, p.active);
      __syncwarp();
      if (threadIdx.x % kWarpSize == 0) red_release_add(p.ready + mb, 1);
    }
  }
  flush_seen(seen, p.active);
}

// Consumer warpgroup g (rows 64 g .. 64 g + 63 of each tile): wgmma over the ring's K slices, each
// slice released to both CTAs' producers once read, then relu(acc) staged for the packers.
template <typename T>
__device__ __forceinline__ void multiply_tiles(const Shared& sh, const Params& p, int g) {
  using namespace sm90;
  const int lane = threadIdx.x % kWarpSize;
  const uint32_t half_rows = uint32_t(g) * 64 * kKRowBytes;  // this warpgroup's A rows
  uint32_t handoffs = 0;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  int stage = 0;
  uint32_t phase = 0;
  // A slice is released in this CTA and in the peer (whose producer wrote half of it here).
  const auto release = [&](int s) {
    if (lane != 0) return;
    const uint32_t bar = smem_addr(&sh.empty[s]);
    barrier_arrive_cluster(cluster_map(bar, sh.rank));
    barrier_arrive_cluster(cluster_map(bar, sh.peer));
  };
  for (int pair = sh.cluster; pair < p.tiles; pair += sh.clusters) {
    int previous = 0;
    for (int kb = 0; kb < p.k_blocks; ++kb) {
      barrier_wait(smem_addr(&sh.full[stage]), phase);
      wgmma_fence();
      const uint32_t a = sh.a_base + stage * kABytes + half_rows;
      const uint32_t b = sh.b_base + stage * kBBytes;
#pragma unroll
      for (int s = 0; s < Cfg::kBlockK / 16; ++s) {
        const uint64_t da = kmajor_swizzled_desc<kKRowBytes>(a + 32 * s);
        const uint64_t db = kmajor_swizzled_desc<kKRowBytes>(b + 32 * s);
        const uint32_t accumulate = (kb > 0 || s > 0) ? 1u : 0u;
        if constexpr (std::is_same_v<T, __half>)
          TWELL_WGMMA_M64N256K16("f16", acc, da, db, accumulate);
        else
          TWELL_WGMMA_M64N256K16("bf16", acc, da, db, accumulate);
      }
      wgmma_commit();
      if (kb > 0) {  // the previous slice's wgmmas are done: its buffer may be refilled
        wgmma_wait<1>();
        release(previous);
      }
      previous = stage;
      if (++stage == Cfg::kStages) stage = 0, phase ^= 1u;
    }
    wgmma_wait<0>();
    release(previous);
    // Hand the rows to the packers, who pack them while this warpgroup starts the next tile.
    if (handoffs > 0) barrier_wait(smem_addr(&sh.freed[g]), (handoffs - 1) & 1u);
    stage_rows<T>(acc, sh.staging + g * kStagingBytes);
    barrier_arrive(smem_addr(&sh.staged[g]));
    ++handoffs;
  }
}
#endif  // TWELL_SM90A_DEVICE

// The roles (file comment): warpgroup 0 loads (warp 0) and packs (warps 1-3), warpgroups 1 and 2
// multiply.
template <typename T, int kTile>
__global__ void __launch_bounds__(kThreads, 1)
    gate_pack_kernel(const __grid_constant__ CUtensorMap x_map,
                     const __grid_constant__ CUtensorMap w_map, const Params p) {
  chain_entry();
#if TWELL_SM90A_DEVICE
  using namespace sm90;
  extern __shared__ uint8_t dynamic_smem[];
  __shared__ __align__(8) uint64_t full[Cfg::kStages];
  __shared__ __align__(8) uint64_t empty[Cfg::kStages];
  __shared__ __align__(8) uint64_t staged[2];
  __shared__ __align__(8) uint64_t freed[2];
  Shared sh;
  sh.full = full;
  sh.empty = empty;
  sh.staged = staged;
  sh.freed = freed;
  sh.a_base = (smem_addr(dynamic_smem) + 1023u) & ~1023u;
  sh.b_base = sh.a_base + Cfg::kStages * kABytes;
  sh.staging = sh.b_base + Cfg::kStages * kBBytes;
  sh.rank = cluster_rank();
  sh.peer = sh.rank ^ 1u;
  sh.cluster = blockIdx.x / kClusterSize;
  sh.clusters = gridDim.x / kClusterSize;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      barrier_init(smem_addr(&full[s]), 1);
      barrier_init(smem_addr(&empty[s]), kClusterSize * kConsumerWarps);
    }
    for (int g = 0; g < 2; ++g) {
      barrier_init(smem_addr(&staged[g]), 128);
      barrier_init(smem_addr(&freed[g]), kPackers);
    }
    barrier_init_fence();
  }
  cluster_sync();  // both CTAs' barriers exist before either loads into or arrives on them

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    regs_decrease<56>();
    if (threadIdx.x == 0)
      load_tiles(sh, &x_map, &w_map, p);
    else if (threadIdx.x >= kWarpSize)
      pack_tiles<T, kTile>(sh, p);
  } else {
    regs_increase<224>();
    multiply_tiles<T>(sh, p, warpgroup - 1);
  }
  cluster_sync();  // no CTA leaves while its peer may still arrive on its barriers
#endif
}

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

EncodeTiled tensor_map_encoder(const char* op) {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found);
    return e == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<EncodeTiled>(f)
                                                                      : nullptr;
  }();
  if (fn == nullptr)
    throw Error(op, "CUDA driver", "cuTensorMapEncodeTiled (driver for CUDA 12.0 or newer)", "missing");
  return fn;
}

// A K-major [rows, k] matrix as TMA boxes of kBlockK x box_rows, swizzled like kmajor_swizzled_desc.
CUtensorMap kmajor_map(const void* base, int64_t rows, int64_t k, uint32_t box_rows, DType dtype,
                       const char* op, const char* name) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(k) * 2};
  const cuuint32_t box[2] = {uint32_t(Cfg::kBlockK), box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder(op)(
      &map, dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      2, const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      kKRowBytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(op, name, "a matrix TMA can describe (cuTensorMapEncodeTiled)",
                "CUresult " + std::to_string(int(r)));
  return map;
}

template <typename T, int kTile>
void launch_typed(const CUtensorMap& x_map, const CUtensorMap& w_map, const Params& p, int64_t pairs,
                  const DeviceInfo& dev, cudaStream_t s, const char* op) {
  auto* kernel = gate_pack_kernel<T, kTile>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)),
             op, "fused gate kernel shared memory");
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = Cfg::kClusterM;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = s;
  config.attrs = &cluster;
  config.numAttrs = 1;
  // Persistent: as many clusters as fit at once (SM pairs within a GPC), at most one per item;
  // asked once per device and instantiation.
  static std::atomic<int> fits[kMaxDevices] = {};
  int clusters = dev.index < kMaxDevices ? fits[dev.index].load(std::memory_order_relaxed) : 0;
  if (clusters == 0) {
    config.gridDim = dim3(unsigned(Cfg::kClusterM) * unsigned(dev.sm_count / Cfg::kClusterM));
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess || clusters < 1) {
      (void)cudaGetLastError();
      clusters = dev.sm_count / Cfg::kClusterM;
    }
    if (dev.index < kMaxDevices) fits[dev.index].store(clusters, std::memory_order_relaxed);
  }
  config.gridDim = dim3(unsigned(Cfg::kClusterM * std::min<int64_t>(pairs, clusters)));
  check_cuda(cudaLaunchKernelEx(&config, kernel, x_map, w_map, p), op,
             "fused gate GEMM + TwELL pack kernel");
}

}  // namespace

bool gate_pack_available(const DeviceInfo& dev) {
#if defined(TWELL_HAS_SM90A)
  return dev.cc_major == 9 && dev.cc_minor == 0;
#else
  (void)dev;
  return false;
#endif
}

void launch_gate_pack(const GatePackArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const char* op = a.op;
  const int64_t m = a.out.shape.rows, n = a.out.shape.cols;
  if (m == 0) return;
  if (!gate_pack_available(dev))
    throw Error(op, "device", "compute capability 9.0 and a build with sm_90a",
                std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor));
  Params p;
  p.m = m;
  p.n = n;
  p.n_blocks = int((n + Cfg::kBlockN - 1) / Cfg::kBlockN);
  p.k_blocks = int((a.k + Cfg::kBlockK - 1) / Cfg::kBlockK);
  // Work items: pairs of 128-row blocks (one per CTA of a cluster) x 256-column blocks.
  const int64_t m_pairs = (m + Cfg::kClusterM * Cfg::kBlockM - 1) / (Cfg::kClusterM * Cfg::kBlockM);
  const int64_t pairs = m_pairs * p.n_blocks;
  if (pairs > int64_t(std::numeric_limits<int>::max()))
    throw Error(op, "x", "fewer than 2^31 output tile pairs", std::to_string(pairs));
  p.tiles = int(pairs);
  p.kind = a.kind;
  p.out = a.out;
  p.hidden = static_cast<uint16_t*>(a.hidden);
  p.active = a.active;
  p.ready = a.ready;
  const CUtensorMap x_map = kmajor_map(a.x, m, a.k, Cfg::kBlockM, a.out.dtype, op, "x");
  const CUtensorMap w_map =
      kmajor_map(a.weight, n, a.k, Cfg::kBlockN / Cfg::kClusterM, a.out.dtype, op, "gate weight");
  check_cuda(cudaMemsetAsync(a.out.row_slot, 0xff, size_t(m) * sizeof(int32_t), s), op,
             "TwELL row slots");  // -1: compact unless the kernel marks the row
  with_element_type(a.out.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    switch (a.out.shape.tile) {
      case 64:
        launch_typed<T, 64>(x_map, w_map, p, pairs, dev, s, op);
        break;
      case 128:
        launch_typed<T, 128>(x_map, w_map, p, pairs, dev, s, op);
        break;
      case 256:
        launch_typed<T, 256>(x_map, w_map, p, pairs, dev, s, op);
        break;
      default:
        throw Error(op, "options.tile", "64, 128 or 256", std::to_string(a.out.shape.tile));
    }
  });
}

int64_t gate_ready_blocks(int64_t rows) {
  const int64_t pair_rows = int64_t(Cfg::kClusterM) * Cfg::kBlockM;  // a cluster's CTAs: a block each
  return (rows + pair_rows - 1) / pair_rows * Cfg::kClusterM;
}

int32_t gate_ready_target(int64_t cols) {
  return int32_t(kPackerWarps * ((cols + Cfg::kBlockN - 1) / Cfg::kBlockN));
}

bool gate_overlap_enabled() {
  static const bool enabled = !env_switch_set("TWELL_NO_OVERLAP");
  return enabled;
}

}  // namespace twell::gpu
