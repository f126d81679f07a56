// Tensor-core GEMMs over routed rows, D [rows, cols] = A [rows, depth] B, where the routed row
// count R = *count (known only on the device) is either the output rows (inference's dense backup;
// training's recompute of g / u / dh and its input gradient) or the reduction depth (training's
// weight gradients). Grids are sized for R = M and persistent; CTAs walk the tiles of the current
// problem and exit past them: R = 0 costs one launch, R = M is a full GEMM.
//   inference backup, rows r of routed_rows:
//     gated:  G[r, :] <- G[r, :] * (x[r] Wu^T)   (in place; tiles whose G is all zero are skipped)
//     both:   y[r, :]  = G[r, :] Wd
//   CTA: one kBlockM x kBlockN output tile at a time; rows of A and B gathered through the routed
//        order, output rows scattered through it (store) or accumulated in place (fp32, one CTA per
//        tile, a fixed reduction order: deterministic).
//   split-K (routed output rows only): when the R routed rows give fewer tiles than the grid has
//        CTAs, a tile's reduction is cut into parts, one CTA each; each writes its fp32 partial
//        tile to scratch and counts itself in; the tile's last CTA adds the parts in part order
//        (deterministic), runs the epilogue and resets the counter.
//   warp: a 32 x 32 sub-tile = 2 x 4 mma.sync m16n8k16 tiles, fp32 accumulators; operands from
//         shared memory through ldmatrix (transposed for A stored [depth][rows], B stored [depth][cols]).
//   thread: cp.async copies of 16-byte vectors of the A and B slices (double-buffered).
#include <algorithm>

#include "cuda/kernels/common/cp_async.cuh"
#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/mma.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/inference.hpp"
#include "cuda/kernels/training.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

using Cfg = RoutedGemmConfig;

constexpr int kThreads = Cfg::kWarpsM * Cfg::kWarpsN * kWarpSize;
constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;        // mma.sync m16n8k16
constexpr int kWarpTileM = Cfg::kBlockM / Cfg::kWarpsM;
constexpr int kWarpTileN = Cfg::kBlockN / Cfg::kWarpsN;
constexpr int kFragsM = kWarpTileM / kMmaM;
constexpr int kFragsN = kWarpTileN / kMmaN;
constexpr int kPad = kVecElems;    // one 16-byte vector per shared row: rows 16-byte aligned, and
                                   // the 8 rows of an ldmatrix 8x8 matrix on distinct banks
constexpr int kAccPad = 4;         // floats: keeps accumulator rows 16-byte aligned

static_assert(Cfg::kStages == 2, "the pipeline below is written for double buffering");
static_assert(kWarpTileM % kMmaM == 0 && kWarpTileN % (2 * kMmaN) == 0 && Cfg::kBlockK % kMmaK == 0,
              "warp tiles and the K slice must be whole mma tiles (B in pairs of n8 tiles)");
static_assert(Cfg::kBlockM % kVecElems == 0 && Cfg::kBlockN % kVecElems == 0 &&
                  Cfg::kBlockK % kVecElems == 0,
              "tiles must be whole 16-byte vectors");

// ldmatrix .x4: lane l names row l % 8 of 8x8 matrix l / 8; register q receives matrix q, each
// lane two consecutive 16-bit values of one row (trans: of one column).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const unsigned at = unsigned(__cvta_generic_to_shared(smem));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}

enum class ALayout : uint8_t {
  row_major,  // A stored [rows][lda]: row i gathered through a_rows
  col_major,  // A stored [depth][lda]: A(i, k) = a[k * lda + i] (a gradient read transposed)
};
enum class BLayout : uint8_t {
  n_by_k,  // B stored [cols][ldb]: B(k, j) = b[j * ldb + k] (a weight used transposed)
  k_by_n,  // B stored [depth][ldb]: row k gathered through b_rows, or from b / b_second by b_split
};
enum class Epilogue : uint8_t {
  gate_product,  // out[out_rows[i]] *= acc in place, rounded to T (h = g * u); tiles of zero g skipped
  store,       // out[out_rows[i]] = acc, rounded to T
  accumulate,  // out[i] += acc, fp32
};
enum class Routed : uint8_t { rows, depth };  // which extent is *count

// A dense operand: row r of the matrix is data + (rows ? rows[r] : r) * ld (elements).
struct Operand {
  const void* data = nullptr;
  int64_t ld = 0;
  const int32_t* rows = nullptr;
};
struct Output {
  void* data = nullptr;
  int64_t ld = 0;
  const int32_t* rows = nullptr;
};

struct Params {
  Operand a;                          // rows: the stored row of output row i (row_major only)
  Operand b;                          // rows: the stored row of reduction index k (k_by_n only)
  const void* b_second = nullptr;     // k_by_n without b.rows: rows k >= b_split come from here
                                      // (nullptr: every row from b)
  int64_t b_split = 0;
  Output out;                         // rows: the stored row of output row i
  int64_t rows = 0;                   // output rows (the worst case when routed == rows)
  int64_t cols = 0;
  int64_t depth = 0;                  // reduction length (ignored when routed == depth)
  Routed routed = Routed::rows;
  const int32_t* count = nullptr;
  int64_t first = 0;                  // the routed extent is min(*count, end) - first (the lists
  int64_t end = INT64_MAX;            // and dense buffers are already offset to row `first`)
  SplitK split_k;                     // rows problems only (null: never split)
};

template <typename T, ALayout kA, BLayout kB>
struct Shared {
  static constexpr int kARows = kA == ALayout::row_major ? Cfg::kBlockM : Cfg::kBlockK;
  static constexpr int kARow = (kA == ALayout::row_major ? Cfg::kBlockK : Cfg::kBlockM) + kPad;
  static constexpr int kBRows = kB == BLayout::n_by_k ? Cfg::kBlockN : Cfg::kBlockK;
  static constexpr int kBRow = (kB == BLayout::n_by_k ? Cfg::kBlockK : Cfg::kBlockN) + kPad;
  static constexpr int kAccRow = Cfg::kBlockN + kAccPad;
  alignas(128) T a[Cfg::kStages][kARows][kARow];
  alignas(128) T b[Cfg::kStages][kBRows][kBRow];
  alignas(128) float acc[Cfg::kBlockM][kAccRow];
  int32_t a_row[Cfg::kBlockM];    // stored A row of each tile row, -1 past the rows
  int32_t out_row[Cfg::kBlockM];  // output row of each tile row, -1 past the rows
  int32_t last;                   // split-K: this CTA is the tile's last part
};

// The current problem's extents.
struct Extent {
  int64_t rows;
  int64_t depth;
};

// A thread's share of each stage's copies: kAVecs vectors of the A slice and kBVecs of the B slice,
// the same places in every stage of a tile. Their sources, places and validity are worked out once
// per tile, so that a stage costs each vector an add, a compare and the copy (the per-stage index
// arithmetic and gathers had made the kernel issue-bound).
template <typename T, ALayout kA, BLayout kB>
struct Copier {
  using S = Shared<T, kA, kB>;
  static constexpr int kAVecs = Cfg::kBlockM * Cfg::kBlockK / kVecElems / kThreads;
  static constexpr int kBVecs = Cfg::kBlockN * Cfg::kBlockK / kVecElems / kThreads;
  static_assert(kAVecs * kThreads * kVecElems == Cfg::kBlockM * Cfg::kBlockK &&
                    kBVecs * kThreads * kVecElems == Cfg::kBlockN * Cfg::kBlockK,
                "every thread copies the same number of vectors");
  const T* a_src[kAVecs];  // the vector's source in slice 0 (nullptr: its row is past the problem)
  int a_at[kAVecs];        // its element offset inside a stage of sm.a
  int a_k[kAVecs];         // its reduction offset inside the slice
  const T* b_src[kBVecs];  // n_by_k: as a_src; k_by_n: b + its column (nullptr: past the columns)
  int b_at[kBVecs];
  int b_k[kBVecs];

  // Vector i of a shared tile of kLen-element rows: its row and its first element in the row.
  template <int kLen>
  struct Place {
    int r, e;
    __device__ explicit Place(int i) : r(i / (kLen / kVecElems)), e(i % (kLen / kVecElems) * kVecElems) {}
  };

  // After the barrier that published sm.a_row.
  __device__ Copier(const S& sm, const Params& p, const Extent& x, int64_t m0, int64_t c0) {
    const auto* a = static_cast<const T*>(p.a.data);
    const auto* b = static_cast<const T*>(p.b.data);
#pragma unroll
    for (int v = 0; v < kAVecs; ++v) {
      const int i = int(threadIdx.x) + v * kThreads;
      if constexpr (kA == ALayout::row_major) {  // [kBlockM][kBlockK]: a row per tile row
        const Place<Cfg::kBlockK> t(i);
        const int32_t row = sm.a_row[t.r];
        a_src[v] = row >= 0 ? a + int64_t(row) * p.a.ld + t.e : nullptr;
        a_k[v] = t.e;
        a_at[v] = t.r * S::kARow + t.e;
      } else {  // [kBlockK][kBlockM]: a reduction index per smem row
        const Place<Cfg::kBlockM> t(i);
        a_src[v] = m0 + t.e < x.rows ? a + int64_t(t.r) * p.a.ld + m0 + t.e : nullptr;
        a_k[v] = t.r;
        a_at[v] = t.r * S::kARow + t.e;
      }
    }
#pragma unroll
    for (int v = 0; v < kBVecs; ++v) {
      const int i = int(threadIdx.x) + v * kThreads;
      if constexpr (kB == BLayout::n_by_k) {  // [kBlockN][kBlockK]: a weight row per column
        const Place<Cfg::kBlockK> t(i);
        b_src[v] = c0 + t.r < p.cols ? b + (c0 + t.r) * p.b.ld + t.e : nullptr;
        b_k[v] = t.e;
        b_at[v] = t.r * S::kBRow + t.e;
      } else {  // [kBlockK][kBlockN]: a reduction index per smem row
        const Place<Cfg::kBlockN> t(i);
        b_src[v] = c0 + t.e < p.cols ? b + c0 + t.e : nullptr;
        b_k[v] = t.r;
        b_at[v] = t.r * S::kBRow + t.e;
      }
    }
  }

  // Starts the copies of the slice at reduction offset k0 into stage `stage`.
  __device__ __forceinline__ void load(S& sm, int stage, const Params& p, const Extent& x, int64_t k0) const {
    const auto* a = static_cast<const T*>(p.a.data);
    const auto* b = static_cast<const T*>(p.b.data);
    T* a_stage = &sm.a[stage][0][0];
    T* b_stage = &sm.b[stage][0][0];
#pragma unroll
    for (int v = 0; v < kAVecs; ++v) {
      const bool ok = a_src[v] != nullptr && k0 + a_k[v] < x.depth;
      const T* src = a;
      if (ok) src = kA == ALayout::row_major ? a_src[v] + k0 : a_src[v] + k0 * p.a.ld;
      cp_async_16(a_stage + a_at[v], src, ok);
    }
#pragma unroll
    for (int v = 0; v < kBVecs; ++v) {
      const int64_t kk = k0 + b_k[v];
      const bool ok = b_src[v] != nullptr && kk < x.depth;
      const T* src = b;
      if constexpr (kB == BLayout::n_by_k) {
        if (ok) src = b_src[v] + k0;
      } else {
        if (ok) {
          if (p.b.rows != nullptr)
            src = b_src[v] + int64_t(p.b.rows[kk]) * p.b.ld;
          else if (p.b_second == nullptr || kk < p.b_split)
            src = b_src[v] + kk * p.b.ld;
          else
            src = static_cast<const T*>(p.b_second) + (b_src[v] - b) + (kk - p.b_split) * p.b.ld;
        }
      }
      cp_async_16(b_stage + b_at[v], src, ok);
    }
  }
};

// Parts of each tile's reduction: 1, or enough to give the grid's CTAs work when the tiles are
// few and the reduction deep (identical in every CTA: it depends on R and the launch only).
__device__ __forceinline__ int64_t split_parts(const Params& p, int64_t tiles, int64_t k_steps) {
  if (p.split_k.partials == nullptr) return 1;
  int64_t parts = min(int64_t(gridDim.x) / tiles, k_steps / Cfg::kMinSplitSteps);
  parts = min(parts, min(int64_t(Cfg::kMaxSplit), int64_t(Cfg::kMaxSplitItems) / tiles));
  if (parts < 2) return 1;
  const int64_t per_part = (k_steps + parts - 1) / parts;
  return (k_steps + per_part - 1) / per_part;  // no empty part
}

// Split-K: writes this part's tile (sm.acc) to scratch; the tile's last part adds every part, in
// part order, back into sm.acc. Returns whether this CTA is that last part (it runs the epilogue).
template <typename S>
__device__ __forceinline__ bool merge_parts(S& sm, const Params& p, int64_t tile, int64_t part, int64_t parts) {
  constexpr int kTileFloats = Cfg::kBlockM * Cfg::kBlockN;
  constexpr int kRowVecs = Cfg::kBlockN / 4;
  float* slots = p.split_k.partials + tile * parts * kTileFloats;  // the tile's parts, in order
  auto* mine = reinterpret_cast<float4*>(slots + part * kTileFloats);
  for (int i = threadIdx.x; i < Cfg::kBlockM * kRowVecs; i += kThreads)
    mine[i] = *reinterpret_cast<const float4*>(&sm.acc[i / kRowVecs][(i % kRowVecs) * 4]);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) sm.last = atomicAdd(&p.split_k.counters[tile], 1) == int32_t(parts - 1);
  __syncthreads();
  if (!sm.last) return false;
  __threadfence();
  for (int i = threadIdx.x; i < Cfg::kBlockM * kRowVecs; i += kThreads) {
    float4 sum = __ldcg(reinterpret_cast<const float4*>(slots) + i);
    for (int64_t q = 1; q < parts; ++q) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(slots + q * kTileFloats) + i);
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    *reinterpret_cast<float4*>(&sm.acc[i / kRowVecs][(i % kRowVecs) * 4]) = sum;
  }
  if (threadIdx.x == 0) p.split_k.counters[tile] = 0;  // zero for the next launch
  __syncthreads();
  return true;
}

// Whether any output value of the tile is non-zero (gate_product: h = 0 * u = 0 needs no product).
template <typename T, ALayout kA, BLayout kB>
__device__ __forceinline__ bool tile_has_nonzero(const Shared<T, kA, kB>& sm, const Params& p,
                                                 int64_t c0) {
  const auto* out = static_cast<const T*>(p.out.data);
  constexpr int kVecs = Cfg::kBlockN / kVecElems;
  bool any = false;
  for (int i = threadIdx.x; i < Cfg::kBlockM * kVecs; i += kThreads) {
    const int32_t row = sm.out_row[i / kVecs];
    const int64_t c = c0 + (i % kVecs) * kVecElems;
    if (row >= 0 && c < p.cols)
      any |= nonzero_count(*reinterpret_cast<const uint4*>(out + row * p.out.ld + c)) != 0;
  }
  return any;
}

// The tile's rows: sm.a_row and sm.out_row of tile rows m0 ... (-1 past the rows). The caller
// synchronises before they are read.
template <typename S>
__device__ __forceinline__ void stage_tile_rows(S& sm, const Params& p, const Extent& x, int64_t m0) {
  for (int r = threadIdx.x; r < Cfg::kBlockM; r += kThreads) {
    const int64_t i = m0 + r;
    const bool in = i < x.rows;
    sm.a_row[r] = in ? (p.a.rows != nullptr ? p.a.rows[i] : int32_t(i)) : -1;
    sm.out_row[r] = in ? (p.out.rows != nullptr ? p.out.rows[i] : int32_t(i)) : -1;
  }
}

// A warp's sub-tile (wm, wn) of the CTA tile, and its lane's row of the ldmatrix 8x8 matrices:
// matrix q = lane / 8 (see ldmatrix_x4).
struct WarpPlace {
  int wm, wn, lane;
  int mat_row, mat_lo, mat_hi;
};

__device__ __forceinline__ WarpPlace warp_place() {
  const int warp = threadIdx.x / kWarpSize;
  WarpPlace w;
  w.wm = warp / Cfg::kWarpsN;
  w.wn = warp % Cfg::kWarpsN;
  w.lane = threadIdx.x % kWarpSize;
  w.mat_row = w.lane % 8;
  w.mat_lo = (w.lane / 8) % 2;
  w.mat_hi = w.lane / 16;
  return w;
}

// acc[i][j]: the m16n8 tile (i, j) of the warp's tile; lane (g = lane / 4, t = lane % 4) holds
// rows g and g + 8, columns 2t and 2t + 1.
using Acc = float[kFragsM][kFragsN][4];

// acc += the warp's share of one K slice in stage `stage` (kBlockK / 16 mma steps).
template <typename T, ALayout kA, BLayout kB>
__device__ __forceinline__ void mma_slice(Acc& acc, const Shared<T, kA, kB>& sm, int stage, const WarpPlace& w) {
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockK; kk += kMmaK) {
    // A 16 x 16: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (8-15, 8-15).
    uint32_t fa[kFragsM][4];
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
      const int m = w.wm * kWarpTileM + i * kMmaM;
      if constexpr (kA == ALayout::row_major)  // stored [m][k]: rows of the matrices are m
        ldmatrix_x4<false>(fa[i], &sm.a[stage][m + w.mat_lo * 8 + w.mat_row][kk + w.mat_hi * 8]);
      else  // stored [k][m]: rows are k, transposed
        ldmatrix_x4<true>(fa[i], &sm.a[stage][kk + w.mat_hi * 8 + w.mat_row][m + w.mat_lo * 8]);
    }
    // B for two n8 tiles: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (8-15, 8-15).
    uint32_t fb[kFragsN / 2][4];
#pragma unroll
    for (int j = 0; j < kFragsN / 2; ++j) {
      const int n = w.wn * kWarpTileN + j * 2 * kMmaN;
      if constexpr (kB == BLayout::n_by_k)  // stored [n][k]: rows of the matrices are n
        ldmatrix_x4<false>(fb[j], &sm.b[stage][n + w.mat_hi * 8 + w.mat_row][kk + w.mat_lo * 8]);
      else  // stored [k][n]: rows are k, transposed
        ldmatrix_x4<true>(fb[j], &sm.b[stage][kk + w.mat_lo * 8 + w.mat_row][n + w.mat_hi * 8]);
    }
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
#pragma unroll
      for (int j = 0; j < kFragsN; ++j)
        mma_16816<T>(acc[i][j], fa[i], fb[j / 2][(j % 2) * 2], fb[j / 2][(j % 2) * 2 + 1]);
  }
}

// acc = the warp's share of the tile at (m0, c0) over the K steps [ks_begin, ks_end): the slices
// copied through the double-buffered stages while the previous one is multiplied.
template <typename T, ALayout kA, BLayout kB>
__device__ __forceinline__ void mma_part(Acc& acc, Shared<T, kA, kB>& sm, const Params& p, const Extent& x,
                                         int64_t m0, int64_t c0, int64_t ks_begin, int64_t ks_end,
                                         const WarpPlace& w) {
#pragma unroll
  for (int i = 0; i < kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < kFragsN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  const Copier<T, kA, kB> copier(sm, p, x, m0, c0);
  copier.load(sm, 0, p, x, ks_begin * Cfg::kBlockK);
  cp_async_commit();
  for (int64_t ks = ks_begin; ks < ks_end; ++ks) {
    const int stage = int((ks - ks_begin) % Cfg::kStages);
    if (ks + 1 < ks_end) copier.load(sm, stage ^ 1, p, x, (ks + 1) * Cfg::kBlockK);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    mma_slice(acc, sm, stage, w);
    __syncthreads();  // the stage just read is the next iteration's load target
  }
}

// The warp's accumulators into the tile's fp32 sm.acc.
template <typename S>
__device__ __forceinline__ void store_acc(S& sm, const Acc& acc, const WarpPlace& w) {
#pragma unroll
  for (int i = 0; i < kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < kFragsN; ++j) {
      const int m = w.wm * kWarpTileM + i * kMmaM + w.lane / 4;
      const int n = w.wn * kWarpTileN + j * kMmaN + (w.lane % 4) * 2;
      *reinterpret_cast<float2*>(&sm.acc[m][n]) = make_float2(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<float2*>(&sm.acc[m + 8][n]) = make_float2(acc[i][j][2], acc[i][j][3]);
    }
}

// The tile's sm.acc into its output rows (kE), a 16-byte vector of T (two float4: accumulate) per
// thread at a time.
template <typename T, ALayout kA, BLayout kB, Epilogue kE>
__device__ __forceinline__ void epilogue(const Shared<T, kA, kB>& sm, const Params& p, int64_t c0) {
  constexpr int kVecs = Cfg::kBlockN / kVecElems;
  for (int i = threadIdx.x; i < Cfg::kBlockM * kVecs; i += kThreads) {
    const int r = i / kVecs;
    const int cc = (i % kVecs) * kVecElems;
    const int32_t row = sm.out_row[r];
    const int64_t c = c0 + cc;
    if (row < 0 || c >= p.cols) continue;
    float v[kVecElems];
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) v[e] = sm.acc[r][cc + e];
    if constexpr (kE == Epilogue::accumulate) {
      auto* dst = reinterpret_cast<float4*>(static_cast<float*>(p.out.data) + row * p.out.ld + c);
      const float4 lo = dst[0], hi = dst[1];
      dst[0] = make_float4(lo.x + v[0], lo.y + v[1], lo.z + v[2], lo.w + v[3]);
      dst[1] = make_float4(hi.x + v[4], hi.y + v[5], hi.z + v[6], hi.w + v[7]);
    } else {
      T* dst = static_cast<T*>(p.out.data) + row * p.out.ld + c;
      if constexpr (kE == Epilogue::gate_product) {
        float g[kVecElems];
        unpack8<T>(*reinterpret_cast<const uint4*>(dst), g);
#pragma unroll
        for (int e = 0; e < kVecElems; ++e) v[e] *= g[e];
      }
      *reinterpret_cast<uint4*>(dst) = pack8<T>(v);
    }
  }
}

template <typename T, ALayout kA, BLayout kB, Epilogue kE>
__global__ void __launch_bounds__(kThreads, Cfg::kCtasPerSm) routed_gemm_kernel(Params p) {
  chain_entry();
  using S = Shared<T, kA, kB>;
  __shared__ S sm;

  const int64_t routed = max(int64_t(0), min(int64_t(*p.count), p.end) - p.first);
  const Extent x{p.routed == Routed::rows ? routed : p.rows, p.routed == Routed::depth ? routed : p.depth};
  if (x.rows == 0 || x.depth == 0) return;
  const int64_t tiles_n = (p.cols + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const int64_t tiles = (x.rows + Cfg::kBlockM - 1) / Cfg::kBlockM * tiles_n;
  const int64_t k_steps = (x.depth + Cfg::kBlockK - 1) / Cfg::kBlockK;
  const int64_t parts = split_parts(p, tiles, k_steps);
  const int64_t steps_per_part = (k_steps + parts - 1) / parts;
  const WarpPlace w = warp_place();

  for (int64_t item = blockIdx.x; item < tiles * parts; item += gridDim.x) {
    const int64_t tile = item % tiles, part = item / tiles;  // all tiles' first parts first
    const int64_t ks_begin = part * steps_per_part;
    const int64_t ks_end = min(k_steps, ks_begin + steps_per_part);
    const int64_t m0 = tile / tiles_n * Cfg::kBlockM;
    const int64_t c0 = tile % tiles_n * Cfg::kBlockN;
    stage_tile_rows(sm, p, x, m0);
    __syncthreads();
    if constexpr (kE == Epilogue::gate_product) {
      if (!__syncthreads_or(tile_has_nonzero(sm, p, c0))) continue;
    }

    Acc acc;
    mma_part(acc, sm, p, x, m0, c0, ks_begin, ks_end, w);
    store_acc(sm, acc, w);
    __syncthreads();
    if (parts > 1 && !merge_parts(sm, p, tile, part, parts)) {
      __syncthreads();  // as at the end of the loop
      continue;
    }
    epilogue<T, kA, kB, kE>(sm, p, c0);
    __syncthreads();  // sm.a_row, sm.out_row and sm.acc are rewritten by the next tile
  }
}

template <ALayout kA, BLayout kB, Epilogue kE>
void launch_gemm(const Params& p, DType dtype, const DeviceInfo& dev, cudaStream_t s, const char* what,
                 const char* op = "TrainingPlan::backward") {
  const int64_t tiles = (p.rows + Cfg::kBlockM - 1) / Cfg::kBlockM *
                        ((p.cols + Cfg::kBlockN - 1) / Cfg::kBlockN);
  if (tiles == 0) return;
  // A full grid even for few tiles: split-K gives the CTAs past the tiles parts of a deep reduction.
  const int64_t grid = std::min<int64_t>(p.split_k.partials != nullptr ? int64_t(Cfg::kMaxSplitItems) : tiles,
                                         int64_t(dev.sm_count) * Cfg::kCtasPerSm);
  with_element_type(dtype, op, [&](auto tag) {
    using T = decltype(tag);
    launch(routed_gemm_kernel<T, kA, kB, kE>, dim3(unsigned(grid)), dim3(kThreads), 0, s, p);
  });
  check_launch(op, what);
}

}  // namespace

namespace {

// One GEMM of p: out = a b, `cols` output columns, reduction length `depth`.
void set_problem(Params& p, Operand a, Operand b, Output out, int64_t cols, int64_t depth) {
  p.a = a;
  p.b = b;
  p.out = out;
  p.cols = cols;
  p.depth = depth;
}

}  // namespace

void launch_routed(const RoutedArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const char* op = "InferencePlan::run";
  const int32_t* routed_rows = a.routed_rows + a.first;
  Params p;
  p.rows = a.rows;
  p.count = a.num_routed;
  p.first = a.first;
  p.split_k = a.split_k;
  if (a.kind == FfnKind::gated) {  // G[r] <- G[r] * (x[r] Wu^T)
    set_problem(p, {a.x, a.k, routed_rows}, {a.up, a.k}, {a.hidden, a.n, routed_rows}, a.n, a.k);
    launch_gemm<ALayout::row_major, BLayout::n_by_k, Epilogue::gate_product>(p, a.dtype, dev, s,
                                                                             "routed-row up GEMM", op);
  }
  // y[r] = G[r] Wd
  set_problem(p, {a.hidden, a.n, routed_rows}, {a.down, a.k}, {a.y, a.k, routed_rows}, a.k, a.n);
  launch_gemm<ALayout::row_major, BLayout::k_by_n, Epilogue::store>(p, a.dtype, dev, s,
                                                                    "routed-row down GEMM", op);
}

namespace {

// Params over a routed range of the training backward: its extent from (first, chunk.end, count);
// at_first_row moves a dense operand (rows s - chunk.base, ld `ld`) to row `first`.
Params routed_params(const RoutedRange& r, Routed routed, SplitK split_k = {}) {
  Params p;
  p.rows = std::min(r.max_rows, r.chunk.end) - r.first;
  p.routed = routed;
  p.count = r.count;
  p.first = r.first;
  p.end = r.chunk.end;
  p.split_k = split_k;
  return p;
}
template <typename Ptr>
Ptr at_first_row(Ptr buffer, const RoutedRange& r, int64_t ld, DType dtype) {
  return buffer + size_t((r.first - r.chunk.base) * ld) * dtype_size(dtype);
}

}  // namespace

void launch_routed_recompute(const RecomputeArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const RoutedGemm& g = a.gemm;
  Params p = routed_params(g.range, Routed::rows, g.split_k);
  set_problem(p, {a.src, g.k, g.range.order + g.range.first}, {a.weight, g.k},
              {at_first_row(static_cast<char*>(a.out), g.range, a.ldo, g.dtype), a.ldo}, a.n_out, g.k);
  launch_gemm<ALayout::row_major, BLayout::n_by_k, Epilogue::store>(p, g.dtype, dev, s,
                                                                    "routed recompute GEMM");
}

void launch_routed_input_grad(const InputGradArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const RoutedGemm& g = a.gemm;
  Params p = routed_params(g.range, Routed::rows, g.split_k);
  set_problem(p, {at_first_row(static_cast<const char*>(a.grad), g.range, a.depth, g.dtype), a.depth},
              {a.weight.first, g.k}, {a.dx, g.k, g.range.order + g.range.first}, g.k, a.depth);
  p.b_second = a.weight.second;
  p.b_split = a.weight.split;
  launch_gemm<ALayout::row_major, BLayout::k_by_n, Epilogue::store>(p, g.dtype, dev, s,
                                                                    "routed input-gradient GEMM");
}

// The routed rows are the reduction here: the output rows are dw's N.
void launch_routed_weight_grad(const WeightGradGemmArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const RoutedGemm& g = a.gemm;
  Params p = routed_params(g.range, Routed::depth);
  p.rows = a.n;
  set_problem(p, {at_first_row(static_cast<const char*>(a.grad), g.range, a.lda, g.dtype), a.lda},
              {a.src, g.k, g.range.order + g.range.first}, {a.dw, g.k}, g.k, 0);
  launch_gemm<ALayout::col_major, BLayout::k_by_n, Epilogue::accumulate>(p, g.dtype, dev, s,
                                                                         "routed weight-gradient GEMM");
}

}  // namespace twell::gpu
