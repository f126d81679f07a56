// TwELL pack: G = x W1^T [rows, N] (before the ReLU) -> per (row, tile) the active entries
// (relu_active: positive or NaN) in ascending column order; a row with more than `capacity` in
// any tile, or with a NaN or infinite value, is routed (listed, counts zero) and its G row
// replaced by the ReLU of it (routed_relu) for the dense backup.
//   CTA: whole rows, grid-stride over a persistent grid; one CTA decides a row (compact or routed)
//        and writes its row_slot, routed_rows entry and counts, so they always agree.
//   warp: tiles w, w + kWarps, ... of the row; entry slots from a prefix sum of lane counts.
//   thread: tile / 32 consecutive columns of a tile (one 4-, 8- or 16-byte load).
// Values are copied as raw 16-bit patterns (an active value is its own ReLU), so the layout
// matches pack_twell of relu(G) on the CPU bit for bit.
#include <algorithm>
#include <cstring>
#include <string>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/launch.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/kernels/inference.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

constexpr int kThreads = PackConfig::kWarps * kWarpSize;
constexpr int kScatterBatch = 8;  // route_overflow_kernel: entries whose loads a lane issues at once

static_assert(kThreads <= 1024, "a pack CTA must fit the CTA size limit");

// The load unit of a lane: kPerLane 16-bit values.
template <int kPerLane>
struct LaneChunk;
template <>
struct LaneChunk<2> { using type = uint32_t; };
template <>
struct LaneChunk<4> { using type = uint2; };
template <>
struct LaneChunk<8> { using type = uint4; };

// The lane's values starting at column `col` of a row (zeros past the last column: N is a
// multiple of 8, so a chunk is either wholly inside the row or wholly past it).
template <int kPerLane>
__device__ __forceinline__ typename LaneChunk<kPerLane>::type load_chunk(const uint16_t* row,
                                                                         int64_t col, int64_t cols) {
  using Chunk = typename LaneChunk<kPerLane>::type;
  Chunk c{};
  if (col < cols) c = *reinterpret_cast<const Chunk*>(row + col);
  return c;
}

// The chunk as 32-bit words (two values each, the lower column in the low half).
__device__ __forceinline__ void to_words(uint32_t c, uint32_t (&w)[1]) { w[0] = c; }
__device__ __forceinline__ void to_words(const uint2& c, uint32_t (&w)[2]) {
  w[0] = c.x;
  w[1] = c.y;
}
__device__ __forceinline__ void to_words(const uint4& c, uint32_t (&w)[4]) {
  w[0] = c.x;
  w[1] = c.y;
  w[2] = c.z;
  w[3] = c.w;
}

template <int kPerLane>
__device__ __forceinline__ uint16_t value_bits(const uint32_t (&w)[kPerLane / 2], int e) {
  return uint16_t(w[e / 2] >> (16 * (e % 2)));
}

// Bit e: value e of the chunk is active.
template <int kPerLane>
__device__ __forceinline__ uint32_t active_mask(const uint32_t (&w)[kPerLane / 2], uint16_t inf_bits) {
  uint32_t mask = 0;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e)
    mask |= uint32_t(relu_active_bits(value_bits<kPerLane>(w, e), inf_bits)) << e;
  return mask;
}

template <int kPerLane>
__device__ __forceinline__ bool any_nonfinite_value(const uint32_t (&w)[kPerLane / 2], uint16_t inf_bits) {
  bool any = false;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) any |= nonfinite_bits(value_bits<kPerLane>(w, e), inf_bits);
  return any;
}

// The value the dense backup reads for a routed row's G value: its ReLU, except that a gated
// layer's -Inf becomes NaN. A -Inf gate with finite weights means x's row is not finite, and then
// every u of the row is infinite or NaN: the dense h = relu(-Inf) * u = 0 * u is NaN, which a
// backup that skips zeros of G (row_ffn.cu's routed rows) would miss.
__device__ __forceinline__ uint16_t routed_relu(uint16_t bits, uint16_t inf_bits, FfnKind kind) {
  if (relu_active_bits(bits, inf_bits)) return bits;
  const bool negative_inf = bits == negative_inf_bits(inf_bits);
  return negative_inf && kind == FfnKind::gated ? quiet_nan_bits(inf_bits) : uint16_t(0);
}

template <int kPerLane>
__device__ __forceinline__ void routed_relu_words(uint32_t (&w)[kPerLane / 2], uint16_t inf_bits,
                                                  FfnKind kind) {
#pragma unroll
  for (int i = 0; i < kPerLane / 2; ++i)
    w[i] = uint32_t(routed_relu(uint16_t(w[i]), inf_bits, kind)) |
           uint32_t(routed_relu(uint16_t(w[i] >> 16), inf_bits, kind)) << 16;
}

template <int kPerLane>
__device__ __forceinline__ void store_chunk(uint16_t* row, int64_t col, int64_t cols,
                                            const uint32_t (&w)[kPerLane / 2]) {
  using Chunk = typename LaneChunk<kPerLane>::type;
  if (col >= cols) return;
  Chunk c;
  static_assert(sizeof(Chunk) == sizeof(w), "a chunk is its words");
  memcpy(&c, w, sizeof c);
  *reinterpret_cast<Chunk*>(row + col) = c;
}

template <int kTile>
__global__ void __launch_bounds__(kThreads, PackConfig::kCtasPerSm)
    pack_kernel(uint16_t* __restrict__ hidden, TwellView out, unsigned long long* active, uint16_t inf_bits,
                FfnKind kind) {
  chain_entry();
  constexpr int kPerLane = kTile / kWarpSize;
  static_assert(kTile % kWarpSize == 0 && kPerLane >= 2 && kPerLane <= kVecElems,
                "a tile must split into 2, 4 or 8 values per lane");
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t rows = out.shape.rows;
  const int64_t cols = out.shape.cols;
  const int num_tiles = int((cols + kTile - 1) / kTile);
  const int capacity = out.shape.capacity;
  auto* values = static_cast<uint16_t*>(out.values);
  unsigned long long seen = 0;

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    uint16_t* g = hidden + row * cols;

    // Phase 1: count each tile; one overflowing tile (or one NaN or Inf) routes the whole row.
    bool overflow = false;
    for (int t = warp; t < num_tiles; t += PackConfig::kWarps) {
      uint32_t words[kPerLane / 2];
      to_words(load_chunk<kPerLane>(g, int64_t(t) * kTile + lane * kPerLane, cols), words);
      const int mine = __popc(active_mask<kPerLane>(words, inf_bits));
      seen += unsigned(mine);
      overflow |= int(__reduce_add_sync(kFullMask, unsigned(mine))) > capacity;
      overflow |= any_nonfinite_value<kPerLane>(words, inf_bits);
    }
    const bool routed = __syncthreads_or(overflow);
    if (threadIdx.x == 0) {
      int32_t slot = -1;
      if (routed) {
        slot = atomicAdd(out.num_routed, 1);
        out.routed_rows[slot] = int32_t(row);
      }
      out.row_slot[row] = slot;
    }

    // Phase 2: entries of a compact row; lane order then value order is column order. A routed
    // row's G becomes the ReLU of it.
    for (int t = warp; t < num_tiles; t += PackConfig::kWarps) {
      const int64_t tile_index = row * num_tiles + t;
      const int64_t col = int64_t(t) * kTile + lane * kPerLane;
      uint32_t words[kPerLane / 2];
      to_words(load_chunk<kPerLane>(g, col, cols), words);
      if (routed) {
        if (lane == 0) out.counts[tile_index] = 0;
        routed_relu_words<kPerLane>(words, inf_bits, kind);
        store_chunk<kPerLane>(g, col, cols, words);
        continue;
      }
      const uint32_t mask = active_mask<kPerLane>(words, inf_bits);
      const int mine = __popc(mask);
      int inclusive = mine;
#pragma unroll
      for (int d = 1; d < kWarpSize; d <<= 1) {
        const int below = __shfl_up_sync(kFullMask, inclusive, d);
        if (lane >= d) inclusive += below;
      }
      const int64_t base = tile_index * capacity;
      int slot = inclusive - mine;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        if (!(mask >> e & 1u)) continue;
        values[base + slot] = value_bits<kPerLane>(words, e);
        out.cols[base + slot] = uint16_t(lane * kPerLane + e);
        ++slot;
      }
      if (lane == kWarpSize - 1) out.counts[tile_index] = uint16_t(inclusive);
    }
  }

  warp_add_count(seen, active);
}

// One warp per row marked kOverflowRow by the fused gate kernel, or (route_above >= 0) compact
// with more than route_above entries: takes a routed slot, writes the row's compact tiles back into
// its G row (overflowed tiles are there already) and zeroes counts. (It used to walk the tiles in
// order, the whole warp on each, one chain of dependent loads per tile: 68 us for the 716 rows
// training routes at heavy-tailed 0.5%, ncu on an H200.)
__global__ void __launch_bounds__(kThreads)
    route_overflow_kernel(TwellView out, uint16_t* __restrict__ hidden, int32_t route_above) {
  chain_entry();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * PackConfig::kWarps;
  const int64_t cols = out.shape.cols, tile = out.shape.tile, capacity = out.shape.capacity;
  const int64_t num_tiles = (cols + tile - 1) / tile;
  const auto* values = static_cast<const uint16_t*>(out.values);
  for (int64_t row = int64_t(blockIdx.x) * PackConfig::kWarps + threadIdx.x / kWarpSize;
       row < out.shape.rows; row += warps) {
    const int32_t mark = out.row_slot[row];
    if (mark != kOverflowRow) {
      if (mark != -1 || route_above < 0) continue;
      int entries = 0;
      for (int64_t t = lane; t < num_tiles; t += kWarpSize) entries += out.counts[row * num_tiles + t];
      if (__reduce_add_sync(kFullMask, unsigned(entries)) <= unsigned(route_above)) continue;
    }
    if (lane == 0) {
      const int32_t slot = atomicAdd(out.num_routed, 1);
      out.routed_rows[slot] = int32_t(row);
      out.row_slot[row] = slot;
    }
    // Lane t rewrites tiles t, t + 32, ... alone (zeros, then its entries over them: one thread's
    // stores to an address stay in order), so nothing waits on another lane and the loads of a
    // tile's entries are issued kScatterBatch at a time, not one dependent round trip per tile.
    for (int64_t t = lane; t < num_tiles; t += kWarpSize) {
      const int64_t index = row * num_tiles + t;
      const int count = out.counts[index];
      if (count != kOverflowCount) {  // an overflowed tile is in G already
        uint16_t* g = hidden + row * cols + t * tile;
        const int64_t width = cols - t * tile < tile ? cols - t * tile : tile;  // a multiple of 8
        for (int64_t v = 0; v < width / kVecElems; ++v) reinterpret_cast<uint4*>(g)[v] = make_uint4(0, 0, 0, 0);
        const uint16_t* entry_cols = out.cols + index * capacity;
        const uint16_t* entry_values = values + index * capacity;
        for (int e0 = 0; e0 < count; e0 += kScatterBatch) {
          uint16_t c[kScatterBatch], v[kScatterBatch];
#pragma unroll
          for (int j = 0; j < kScatterBatch; ++j)
            if (e0 + j < count) {
              c[j] = __ldg(entry_cols + e0 + j);
              v[j] = __ldg(entry_values + e0 + j);
            }
#pragma unroll
          for (int j = 0; j < kScatterBatch; ++j)
            if (e0 + j < count) g[c[j]] = v[j];
        }
      }
      out.counts[index] = 0;
    }
  }
}

}  // namespace

void launch_pack(const PackArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  const int64_t rows = a.out.shape.rows;
  if (rows == 0) return;
  const int64_t grid = std::min<int64_t>(rows, int64_t(dev.sm_count) * PackConfig::kCtasPerSm);
  auto* g = static_cast<uint16_t*>(a.hidden);
  uint16_t inf_bits = 0;
  with_element_type(a.out.dtype, "InferencePlan::run",
                    [&](auto tag) { inf_bits = Elem<decltype(tag)>::kInfBits; });
  const auto run = [&](auto kernel) {
    launch(kernel, dim3(unsigned(grid)), dim3(kThreads), 0, s, g, a.out, a.active, inf_bits, a.kind);
  };
  switch (a.out.shape.tile) {
    case 64:
      run(pack_kernel<64>);
      break;
    case 128:
      run(pack_kernel<128>);
      break;
    case 256:
      run(pack_kernel<256>);
      break;
    default:
      throw Error("InferencePlan::run", "options.tile", "64, 128 or 256",
                  std::to_string(a.out.shape.tile));
  }
  check_launch("InferencePlan::run", "TwELL pack kernel");
}

void launch_route_overflow(const TwellView& out, void* hidden, const DeviceInfo& dev, cudaStream_t s,
                           const char* op, int32_t route_above) {
  const int64_t rows = out.shape.rows;
  if (rows == 0) return;
  const int64_t grid = std::min<int64_t>((rows + PackConfig::kWarps - 1) / PackConfig::kWarps,
                                         int64_t(dev.sm_count) * PackConfig::kCtasPerSm);
  launch(route_overflow_kernel, dim3(unsigned(grid)), dim3(kThreads), 0, s, out,
         static_cast<uint16_t*>(hidden), route_above);
  check_launch(op, "TwELL overflow routing kernel");
}

}  // namespace twell::gpu
