// Exact dense backup of routed rows on tensor cores. The routed row count R = *num_routed exists
// only on the device, so both GEMMs run on persistent grids sized for R = M whose CTAs walk the
// tiles of [R, n_out] and exit past them: R = 0 costs one launch each, R = M is a full GEMM.
//   gated:  G[r, :] <- G[r, :] * (x[r] Wu^T)   (in place; tiles whose G is all zero are skipped)
//   both:   y[r, :]  = G[r, :] Wd
//   CTA: one kBlockM x kBlockN output tile at a time (rows gathered through routed_rows).
//   warp: a 32 x 32 sub-tile = 2 x 2 WMMA 16x16x16 fragments, fp32 accumulators.
//   thread: cp.async copies of 16-byte vectors of the A rows and B slices (double-buffered).
#include <mma.h>

#include <algorithm>
#include <type_traits>

#include "cuda/config.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/element.cuh"
#include "cuda/kernels.hpp"

namespace twell::gpu {

namespace {

namespace wmma = nvcuda::wmma;
using Cfg = RoutedGemmConfig;

constexpr int kWarpSize = 32;
constexpr int kThreads = Cfg::kWarpsM * Cfg::kWarpsN * kWarpSize;
constexpr int kFrag = 16;                                // WMMA m = n = k
constexpr int kWarpTileM = Cfg::kBlockM / Cfg::kWarpsM;
constexpr int kWarpTileN = Cfg::kBlockN / Cfg::kWarpsN;
constexpr int kFragsM = kWarpTileM / kFrag;
constexpr int kFragsN = kWarpTileN / kFrag;
constexpr int kPad = kVecElems;    // one 16-byte vector per shared row: 32-byte aligned fragments
constexpr int kAccPad = 4;         // floats: keeps accumulator rows 16-byte aligned
constexpr int kVectorBytes = 16;

static_assert(Cfg::kStages == 2, "the pipeline below is written for double buffering");
static_assert(kWarpTileM % kFrag == 0 && kWarpTileN % kFrag == 0 && Cfg::kBlockK % kFrag == 0,
              "warp tiles and the K slice must be whole WMMA fragments");
static_assert(Cfg::kBlockN % kVecElems == 0 && Cfg::kBlockK % kVecElems == 0,
              "tiles must be whole 16-byte vectors");

enum class BLayout : uint8_t {
  n_by_k,  // B stored [n_out, k] (Wu: the product uses its transpose)
  k_by_n,  // B stored [k, n_out] (Wd)
};
enum class Epilogue : uint8_t {
  gate_product,  // out <- out * acc, in place (h = g * u)
  store,         // out <- acc
};

struct GemmParams {
  const void* a = nullptr;   // row of routed slot s: a + routed_rows[s] * lda, k values
  int64_t lda = 0;
  const void* b = nullptr;   // see BLayout
  int64_t ldb = 0;
  void* out = nullptr;       // row of routed slot s: out + routed_rows[s] * ldo, n_out values
  int64_t ldo = 0;
  int64_t n_out = 0;
  int64_t k = 0;
  const int32_t* routed_rows = nullptr;
  const int32_t* num_routed = nullptr;
};

template <typename T, BLayout kB>
struct Shared {
  static constexpr int kARow = Cfg::kBlockK + kPad;
  static constexpr int kBRows = kB == BLayout::n_by_k ? Cfg::kBlockN : Cfg::kBlockK;
  static constexpr int kBRow = (kB == BLayout::n_by_k ? Cfg::kBlockK : Cfg::kBlockN) + kPad;
  static constexpr int kAccRow = Cfg::kBlockN + kAccPad;
  alignas(128) T a[Cfg::kStages][Cfg::kBlockM][kARow];
  alignas(128) T b[Cfg::kStages][kBRows][kBRow];
  alignas(128) float acc[Cfg::kBlockM][kAccRow];
  int32_t rows[Cfg::kBlockM];  // routed row of each tile row, -1 past R
};

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = unsigned(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? kVectorBytes : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all_but_one() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

template <typename T, BLayout kB>
__device__ __forceinline__ void load_stage(Shared<T, kB>& sm, int stage, const GemmParams& p,
                                           int64_t c0, int64_t k0) {
  const auto* a = static_cast<const T*>(p.a);
  const auto* b = static_cast<const T*>(p.b);
  constexpr int kAVecs = Cfg::kBlockK / kVecElems;
  for (int i = threadIdx.x; i < Cfg::kBlockM * kAVecs; i += kThreads) {
    const int r = i / kAVecs;
    const int64_t kk = k0 + (i % kAVecs) * kVecElems;
    const int32_t row = sm.rows[r];
    const bool ok = row >= 0 && kk < p.k;
    cp_async_16(&sm.a[stage][r][(i % kAVecs) * kVecElems], ok ? a + row * p.lda + kk : a, ok);
  }
  if constexpr (kB == BLayout::n_by_k) {
    for (int i = threadIdx.x; i < Cfg::kBlockN * kAVecs; i += kThreads) {
      const int r = i / kAVecs;
      const int64_t c = c0 + r;
      const int64_t kk = k0 + (i % kAVecs) * kVecElems;
      const bool ok = c < p.n_out && kk < p.k;
      cp_async_16(&sm.b[stage][r][(i % kAVecs) * kVecElems], ok ? b + c * p.ldb + kk : b, ok);
    }
  } else {
    constexpr int kBVecs = Cfg::kBlockN / kVecElems;
    for (int i = threadIdx.x; i < Cfg::kBlockK * kBVecs; i += kThreads) {
      const int r = i / kBVecs;
      const int64_t kk = k0 + r;
      const int64_t c = c0 + (i % kBVecs) * kVecElems;
      const bool ok = kk < p.k && c < p.n_out;
      cp_async_16(&sm.b[stage][r][(i % kBVecs) * kVecElems], ok ? b + kk * p.ldb + c : b, ok);
    }
  }
}

// Whether any G value of the tile is non-zero (h = 0 * u = 0 needs no product).
template <typename T, BLayout kB>
__device__ __forceinline__ bool tile_has_nonzero(const Shared<T, kB>& sm, const GemmParams& p,
                                                 int64_t c0) {
  const auto* out = static_cast<const T*>(p.out);
  constexpr int kVecs = Cfg::kBlockN / kVecElems;
  bool any = false;
  for (int i = threadIdx.x; i < Cfg::kBlockM * kVecs; i += kThreads) {
    const int32_t row = sm.rows[i / kVecs];
    const int64_t c = c0 + (i % kVecs) * kVecElems;
    if (row >= 0 && c < p.n_out)
      any |= nonzero_count(*reinterpret_cast<const uint4*>(out + row * p.ldo + c)) != 0;
  }
  return any;
}

template <typename T, BLayout kB, Epilogue kE>
__global__ void __launch_bounds__(kThreads) routed_gemm_kernel(GemmParams p) {
  using S = Shared<T, kB>;
  using BFragLayout = std::conditional_t<kB == BLayout::n_by_k, wmma::col_major, wmma::row_major>;
  __shared__ S sm;

  const int64_t routed = *p.num_routed;
  const int64_t tiles_n = (p.n_out + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const int64_t tiles = (routed + Cfg::kBlockM - 1) / Cfg::kBlockM * tiles_n;
  const int64_t k_steps = (p.k + Cfg::kBlockK - 1) / Cfg::kBlockK;
  const int warp = threadIdx.x / kWarpSize;
  const int wm = warp / Cfg::kWarpsN;
  const int wn = warp % Cfg::kWarpsN;
  auto* out = static_cast<T*>(p.out);

  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t s0 = tile / tiles_n * Cfg::kBlockM;
    const int64_t c0 = tile % tiles_n * Cfg::kBlockN;
    for (int r = threadIdx.x; r < Cfg::kBlockM; r += kThreads)
      sm.rows[r] = s0 + r < routed ? p.routed_rows[s0 + r] : -1;
    __syncthreads();
    if constexpr (kE == Epilogue::gate_product) {
      if (!__syncthreads_or(tile_has_nonzero(sm, p, c0))) continue;
    }

    wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float> acc[kFragsM][kFragsN];
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    load_stage(sm, 0, p, c0, 0);
    cp_async_commit();
    for (int64_t ks = 0; ks < k_steps; ++ks) {
      const int stage = int(ks % Cfg::kStages);
      if (ks + 1 < k_steps) load_stage(sm, stage ^ 1, p, c0, (ks + 1) * Cfg::kBlockK);
      cp_async_commit();
      cp_async_wait_all_but_one();
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < Cfg::kBlockK; kk += kFrag) {
        wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, wmma::row_major> fa[kFragsM];
        wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, BFragLayout> fb[kFragsN];
#pragma unroll
        for (int i = 0; i < kFragsM; ++i)
          wmma::load_matrix_sync(fa[i], &sm.a[stage][wm * kWarpTileM + i * kFrag][kk], S::kARow);
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) {
          const int n = wn * kWarpTileN + j * kFrag;
          if constexpr (kB == BLayout::n_by_k)
            wmma::load_matrix_sync(fb[j], &sm.b[stage][n][kk], S::kBRow);
          else
            wmma::load_matrix_sync(fb[j], &sm.b[stage][kk][n], S::kBRow);
        }
#pragma unroll
        for (int i = 0; i < kFragsM; ++i)
#pragma unroll
          for (int j = 0; j < kFragsN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
      __syncthreads();  // the stage just read is the next iteration's load target
    }

#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
#pragma unroll
      for (int j = 0; j < kFragsN; ++j)
        wmma::store_matrix_sync(&sm.acc[wm * kWarpTileM + i * kFrag][wn * kWarpTileN + j * kFrag],
                                acc[i][j], S::kAccRow, wmma::mem_row_major);
    __syncthreads();

    constexpr int kVecs = Cfg::kBlockN / kVecElems;
    for (int i = threadIdx.x; i < Cfg::kBlockM * kVecs; i += kThreads) {
      const int r = i / kVecs;
      const int32_t row = sm.rows[r];
      const int64_t c = c0 + (i % kVecs) * kVecElems;
      if (row < 0 || c >= p.n_out) continue;
      T* dst = out + row * p.ldo + c;
      float v[kVecElems];
#pragma unroll
      for (int e = 0; e < kVecElems; ++e) v[e] = sm.acc[r][(i % kVecs) * kVecElems + e];
      if constexpr (kE == Epilogue::gate_product) {
        float g[kVecElems];
        unpack8<T>(*reinterpret_cast<const uint4*>(dst), g);
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) v[e] *= g[e];
      }
      *reinterpret_cast<uint4*>(dst) = pack8<T>(v);
    }
    __syncthreads();  // sm.rows and sm.acc are rewritten by the next tile
  }
}

template <typename T, BLayout kB, Epilogue kE>
void launch_gemm(const GemmParams& p, int64_t max_rows, const DeviceInfo& dev, cudaStream_t s) {
  const int64_t max_tiles = (max_rows + Cfg::kBlockM - 1) / Cfg::kBlockM *
                            ((p.n_out + Cfg::kBlockN - 1) / Cfg::kBlockN);
  const int64_t grid = std::min<int64_t>(max_tiles, int64_t(dev.sm_count) * Cfg::kCtasPerSm);
  routed_gemm_kernel<T, kB, kE><<<unsigned(grid), kThreads, 0, s>>>(p);
  check_launch("InferencePlan::run", "routed-row GEMM kernel");
}

}  // namespace

void launch_routed(const RoutedArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  if (a.rows == 0) return;
  with_element_type(a.dtype, "InferencePlan::run", [&](auto tag) {
    using T = decltype(tag);
    if (a.kind == FfnKind::gated) {
      GemmParams up;
      up.a = a.x;
      up.lda = a.k;
      up.b = a.up;
      up.ldb = a.k;
      up.out = a.hidden;
      up.ldo = a.n;
      up.n_out = a.n;
      up.k = a.k;
      up.routed_rows = a.routed_rows;
      up.num_routed = a.num_routed;
      launch_gemm<T, BLayout::n_by_k, Epilogue::gate_product>(up, a.rows, dev, s);
    }
    GemmParams down;
    down.a = a.hidden;
    down.lda = a.n;
    down.b = a.down;
    down.ldb = a.k;
    down.out = a.y;
    down.ldo = a.k;
    down.n_out = a.k;
    down.k = a.n;
    down.routed_rows = a.routed_rows;
    down.num_routed = a.num_routed;
    launch_gemm<T, BLayout::k_by_n, Epilogue::store>(down, a.rows, dev, s);
  });
}

}  // namespace twell::gpu
