// The resident row stage: up + down over compact rows with the weights held in shared memory.
//   lists (a warp per batch of kTokens rows): a count pass (each row's entries; routed rows and
//     rows over e_max entries to the dense backup), a scan of the batches' list sizes, a fill pass
//     that sorts each batch's entries into its dots lists (one per neuron group) and its axpys
//     list, ordered so that the 8 rows of every ldmatrix phase fall on distinct shared-memory
//     bank positions wherever the entries allow it.
//   dots (gated; CTA = neuron group g x K slice s of kDotsCols, one per SM, 16 warps): Wu's group
//     rows over the slice stay in shared memory; a warp takes a contiguous range of batches, its
//     rows' x slices as mma B fragments in registers (loaded from global memory kBatchesAhead
//     batches ahead), 16 list entries per m16n8k16 A tile (ldmatrix rows gathered from the block);
//     the lane holding entry i's row column stores its partial dot into the row's G row.
//   reduce (a warp per row): h = g * (the partials summed in slice order), rounded once, into the
//     entry's axpys slot.
//   axpys (CTA = K slice of kAxpysCols, one per SM, 16 warps): Wd over the slice for every neuron
//     in shared memory; a warp streams its batches' lists (cp.async ring) and accumulates
//     y^T[16 columns, 8 rows] on tensor cores (A = Wd^T gathered by ldmatrix.trans, B = each
//     slot's h in its row's column), then writes the rows' 16 columns.
// docs/kernels.md ("Resident row stage") has the reasoning and the measurements.
#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/config.hpp"
#include "cuda/cp_async.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/element.cuh"
#include "cuda/kernels.hpp"
#include "cuda/launch.cuh"
#include "cuda/mma.cuh"
#include "cuda/train_scan.cuh"
#include "cuda/warp_rows.cuh"

namespace twell::gpu {

namespace {

using Cfg = ResidentConfig;
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxGroups = 16;              // dots groups the list pass sorts by (bins: x 8 keys)
constexpr int kBankKeys = 8;                // 16-byte positions of a 128-byte shared-memory line
constexpr int kDotsRowBytes = Cfg::kDotsCols * 2;    // 256: a resident Wu row over the slice
constexpr int kAxpysRowBytes = Cfg::kAxpysCols * 2;  // 32: a resident Wd row over the slice
constexpr int kTileSlots = 16;              // list entries per m16n8k16 tile (2 phases of 8)
constexpr int kPhase = 8;                   // rows of one ldmatrix 8x8 matrix
constexpr uint32_t kPadEntry = 0xffffu;     // the entry field of a dots pad slot
constexpr int kNeuronBits = 13;             // axpys word: neuron | row in batch << 13 | h << 16
constexpr int kScanThreads = 1024;
static_assert(Cfg::kTokens == 8, "the mma's n8 is the batch's rows");
static_assert(Cfg::kMaxNeurons == 1 << kNeuronBits, "axpys words keep 13 bits of neuron");
static_assert(Cfg::kListBytes == kWarpSize * 16, "a list step is one 16-byte copy per lane");
static_assert(Cfg::kMaxEntries < int(kPadEntry), "entries fit the dots words' 16-bit field");
static_assert(Cfg::kDotsCols == 128, "the dots block's K order below is written for 128 columns");

struct Params {
  FfnKind kind;
  int64_t rows, k, n;
  TwellView tw;
  int32_t tiles_per_group, groups, slices, e_max;
  const void* x;
  const void* up;
  const void* down;
  void* y;
  void* hidden;
  int32_t* heavy_rows;
  int32_t* num_heavy;
  int32_t* row_entries;
  int32_t* dots_offsets;
  int32_t* axpys_offsets;
  uint32_t* dots_taus;
  uint32_t* dots_lists;
  uint32_t* axpys_lists;
};

__host__ __device__ __forceinline__ int64_t num_batches(int64_t rows) {
  return (rows + Cfg::kTokens - 1) / Cfg::kTokens;
}

// A resident row's G row as 32-bit words: partials [slices][e_max], then axpys slots [e_max].
template <typename T>
__device__ __forceinline__ float* row_words(const Params& p, int64_t row) {
  return reinterpret_cast<float*>(static_cast<T*>(p.hidden) + row * p.n);
}

// The bank position of Wd row n's first 16-byte chunk in the axpys block: 128-byte lines hold 4
// rows; XOR with the line number spreads rows over all 8 positions.
__device__ __forceinline__ int axpys_key(int n) { return (2 * (n & 3)) ^ ((n >> 2) & 7); }

// ------------------------------------------------------------------------------------------------
// Lists.

// Count pass: row_entries for the batch's rows, the routed and long rows listed for the backup
// (long ones written densely into G), and the sizes of the batch's lists. Lanes 4t .. 4t + 3 read
// row t's tile counts (every 4th tile each), so the 8 rows' loads are in flight together.
template <typename T>
__global__ void __launch_bounds__(Cfg::kListWarps* kWarpSize) count_kernel(Params p) {
  chain_entry();
  constexpr int kLanesPerRow = kWarpSize / Cfg::kTokens;
  __shared__ int group_entries[Cfg::kListWarps][kMaxGroups];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t batches = num_batches(p.rows);
  const int64_t b = int64_t(blockIdx.x) * Cfg::kListWarps + warp;
  if (b >= batches) return;
  const TwellView& tw = p.tw;
  const int num_tiles = int((tw.shape.cols + tw.shape.tile - 1) / tw.shape.tile);
  if (lane < kMaxGroups) group_entries[warp][lane] = 0;
  __syncwarp();
  const int t = lane / kLanesPerRow;
  const int64_t row = b * Cfg::kTokens + t;
  const bool compact = row < p.rows && tw.row_slot[row] == -1;
  int total = 0;
  if (compact)
    for (int tile = lane % kLanesPerRow; tile < num_tiles; tile += kLanesPerRow) total += tw.counts[row * num_tiles + tile];
#pragma unroll
  for (int d = 1; d < kLanesPerRow; d <<= 1) total += __shfl_xor_sync(kFullMask, total, d);
  const bool resident = compact && total <= p.e_max;
  if (resident && p.slices > 0)
    for (int tile = lane % kLanesPerRow; tile < num_tiles; tile += kLanesPerRow) {
      const int c = tw.counts[row * num_tiles + tile];
      if (c > 0) atomicAdd(&group_entries[warp][tile / p.tiles_per_group], c);
    }
  const int entries = resident ? total : -1;
  if (lane % kLanesPerRow == 0 && row < p.rows) {
    p.row_entries[row] = entries;
    if (!resident) p.heavy_rows[atomicAdd(p.num_heavy, 1)] = int32_t(row);
  }
  // Compact rows over e_max entries: written densely into their G rows for the backup.
  for (int r = 0; r < Cfg::kTokens; ++r) {
    const bool dense_row = __shfl_sync(kFullMask, compact && !resident, r * kLanesPerRow);
    if (dense_row) {
      const int64_t at = b * Cfg::kTokens + r;
      warp_rows::densify_row(tw, at, static_cast<T*>(p.hidden) + at * p.n, lane, kWarpSize, [] { __syncwarp(); });
    }
  }
  int batch_entries = lane % kLanesPerRow == 0 && entries > 0 ? entries : 0;
#pragma unroll
  for (int d = kWarpSize / 2; d > 0; d >>= 1) batch_entries += __shfl_xor_sync(kFullMask, batch_entries, d);
  __syncwarp();
  if (lane < p.groups) {
    const int e = group_entries[warp][lane];
    p.dots_offsets[lane * batches + b] = (e + kTileSlots - 1) / kTileSlots * kTileSlots;  // whole tiles
  }
  if (lane == 0) p.axpys_offsets[b] = (batch_entries + kTileSlots - 1) / kTileSlots * kTileSlots;
}

// In place: a[0, n) becomes its exclusive prefix sum and a[n] the total (CTA 0: the dots offsets,
// CTA 1: the axpys offsets).
__global__ void __launch_bounds__(kScanThreads) scan_kernel(int32_t* dots, int64_t dots_n, int32_t* axpys,
                                                            int64_t axpys_n) {
  chain_entry();
  __shared__ scan::ScanShared sm;
  int32_t* a = blockIdx.x == 0 ? dots : axpys;
  const int64_t n = blockIdx.x == 0 ? dots_n : axpys_n;
  if (a == nullptr) return;
  constexpr int kPerThread = 16;  // consecutive values a thread loads at once
  int64_t carry = 0;
  for (int64_t base = 0; base < n; base += int64_t(kScanThreads) * kPerThread) {
    const int64_t i = base + int64_t(threadIdx.x) * kPerThread;
    int32_t v[kPerThread];
    int64_t sum = 0;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      v[j] = i + j < n ? a[i + j] : 0;
      sum += v[j];
    }
    int64_t total = 0;
    int64_t run = carry + scan::exclusive_scan(sum, sm, total);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      if (i + j < n) a[i + j] = int32_t(run);
      run += v[j];
    }
    carry += total;
    __syncthreads();  // sm is reused by the next chunk
  }
  if (threadIdx.x == 0) a[n] = int32_t(carry);
}

// Stable counting sort of a warp's staged entries by key(word) in [0, bins): calls
// emit(word, position) once per entry. start (optional, bins + 1 ints) receives each key's first
// position. The histogram's atomics are order-free; positions come from ballot ranks, so the
// result is the same every run.
template <typename Key, typename Emit>
__device__ void sort_entries(const uint32_t* stage, int n, int bins, int* count, int* start, Key&& key,
                             Emit&& emit, int lane) {
  for (int i = lane; i < bins; i += kWarpSize) count[i] = 0;
  __syncwarp();
  for (int i = lane; i < n; i += kWarpSize) atomicAdd(&count[key(stage[i])], 1);
  __syncwarp();
  // Exclusive scan of the bins, up to 4 per lane.
  int local[4], sum = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int bin = lane * 4 + j;
    local[j] = bin < bins ? count[bin] : 0;
    sum += local[j];
  }
  int incl = sum;
#pragma unroll
  for (int d = 1; d < kWarpSize; d <<= 1) {
    const int v = __shfl_up_sync(kFullMask, incl, d);
    if (lane >= d) incl += v;
  }
  int run = incl - sum;
  __syncwarp();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int bin = lane * 4 + j;
    if (bin < bins) {
      count[bin] = run;
      if (start != nullptr) start[bin] = run;
    }
    run += local[j];
  }
  if (start != nullptr && lane == kWarpSize - 1) start[bins] = incl;
  __syncwarp();
  for (int i0 = 0; i0 < n; i0 += kWarpSize) {
    const int i = i0 + lane;
    const bool active = i < n;
    const unsigned members = __ballot_sync(kFullMask, active);
    uint32_t word = 0;
    int k = 0, pos = 0, base = 0;
    unsigned peers = 0;
    if (active) {
      word = stage[i];
      k = key(word);
      peers = __match_any_sync(members, k);
      base = count[k];
      pos = base + __popc(peers & ((1u << lane) - 1));
    }
    __syncwarp();
    if (active && lane == __ffs(peers) - 1) count[k] = base + __popc(peers);
    __syncwarp();
    if (active) emit(word, pos);
  }
  __syncwarp();
}

// Staged entry: neuron | row in batch << 16 | entry within the row << 19.
__device__ __forceinline__ int staged_neuron(uint32_t w) { return int(w & 0xffffu); }
__device__ __forceinline__ int staged_token(uint32_t w) { return int(w >> 16 & 7u); }
__device__ __forceinline__ int staged_entry(uint32_t w) { return int(w >> 19); }

// Slot of the position-th entry of a list dealt over `phases` phases of 8 in sorted order: phase
// position % phases, row position / phases (a key with no more entries than phases meets itself in
// no phase).
__device__ __forceinline__ int dealt_slot(int position, int phases) {
  return position % phases * kPhase + position / phases;
}

// The fill pass's shared memory per warp, in 32-bit words: the stage, the sort's bins and each
// key's first position, the batch's figures, and the (group, row, key) counts for the rotations.
constexpr int kBins = kMaxGroups * kBankKeys;
constexpr int kInfoWords = Cfg::kTokens + 2 * kMaxGroups;
constexpr int kKeyCountWords = kMaxGroups * Cfg::kTokens * kBankKeys;
__host__ __device__ __forceinline__ int fill_warp_words(int e_max) {
  return Cfg::kTokens * e_max + kBins + (kBins + 1) + kInfoWords + kKeyCountWords;
}

// Dots rotations: each row t of group g's list reads its resident rows' chunks rotated by an even
// tau_t < 8 (chunk c ^ tau_t at mma position c, its x slice rotated alike), which moves its
// entries' bank keys to key ^ tau_t. Greedy over the rows: each takes the tau (lane l tries
// 2 (l % 4)) that keeps the group's key histogram lowest (largest bin, then sum of squares).
constexpr int kTaus = 4;
__device__ uint32_t choose_taus(const int* counts, int lane) {
  int hist[kBankKeys] = {};
  uint32_t taus = 0;
  const int mine = 2 * (lane % kTaus);
  for (int t = 0; t < Cfg::kTokens; ++t) {
    const int* c = counts + t * kBankKeys;
    int score = 0, top = 0;
#pragma unroll
    for (int k = 0; k < kBankKeys; ++k) {
      const int v = hist[k] + c[k ^ mine];
      top = max(top, v);
      score += v * v;
    }
    // Largest bin, then sum of squares (each clamped to its bits), then the candidate: one int
    // per candidate, ordered.
    int best = (min(top, (1 << 11) - 1) << 20) | (min(score, (1 << 17) - 1) << 3) | mine;
#pragma unroll
    for (int d = 1; d < kTaus; d <<= 1) best = min(best, __shfl_xor_sync(kFullMask, best, d));
    const int tau = best & (kBankKeys - 1);
#pragma unroll
    for (int k = 0; k < kBankKeys; ++k) hist[k] += c[k ^ tau];
    taus |= uint32_t(tau) << (3 * t);
  }
  return taus;
}

// Fill pass: the batch's entries staged in shared memory, then sorted into its axpys list and
// (gated) its dots lists; each resident row's G row records where its entries went in the axpys
// list (for the reduce pass's h).
template <typename T>
__global__ void __launch_bounds__(Cfg::kListWarps* kWarpSize) fill_kernel(Params p) {
  chain_entry();
  extern __shared__ uint32_t list_smem[];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t batches = num_batches(p.rows);
  const int64_t b = int64_t(blockIdx.x) * Cfg::kListWarps + warp;
  if (b >= batches) return;
  uint32_t* stage = list_smem + size_t(warp) * fill_warp_words(p.e_max);
  int* count = reinterpret_cast<int*>(stage + Cfg::kTokens * p.e_max);
  int* start = count + kBins;
  int* row_base = start + kBins + 1;           // row t's first stage position
  int* group_offset = row_base + Cfg::kTokens;  // group g's list for this batch
  auto* group_tau = reinterpret_cast<uint32_t*>(group_offset + kMaxGroups);
  int* key_counts = reinterpret_cast<int*>(group_tau + kMaxGroups);
  const TwellView& tw = p.tw;
  const int64_t row0 = b * Cfg::kTokens;

  int entries = 0;
  if (lane < Cfg::kTokens && row0 + lane < p.rows) entries = max(p.row_entries[row0 + lane], 0);
  int entry_end = entries;  // inclusive prefix sum over the rows
#pragma unroll
  for (int d = 1; d < Cfg::kTokens; d <<= 1) {
    const int e = __shfl_up_sync(kFullMask, entry_end, d);
    if (lane >= d) entry_end += e;
  }
  const int total = __shfl_sync(kFullMask, entry_end, Cfg::kTokens - 1);
  if (lane < Cfg::kTokens) row_base[lane] = entry_end - entries;
  if (lane < p.groups) group_offset[lane] = p.dots_offsets[lane * batches + b];

  // Stage every entry of the batch's resident rows: rows in order, TwELL order inside a row.
  for (int t = 0; t < Cfg::kTokens; ++t) {
    const int e_t = __shfl_sync(kFullMask, entries, t);
    if (e_t == 0) continue;
    const int base = __shfl_sync(kFullMask, entry_end - entries, t);
    int seen = 0;
    warp_rows::for_each_entry_group(tw, row0 + t, lane, [&](int neuron, int64_t, int group_count) {
      if (lane < group_count)
        stage[base + seen + lane] = uint32_t(neuron) | uint32_t(t) << 16 | uint32_t(seen + lane) << 19;
      seen += group_count;
    });
  }
  __syncwarp();

  // Axpys: the batch's entries sorted by bank key and dealt over the list's phases.
  const int64_t axpys0 = p.axpys_offsets[b];
  const int axpys_phases = int(p.axpys_offsets[b + 1] - axpys0) / kPhase;
  sort_entries(
      stage, total, kBankKeys, count, nullptr, [](uint32_t w) { return axpys_key(staged_neuron(w)); },
      [&](uint32_t w, int pos) {
        const int t = staged_token(w);
        const int slot = dealt_slot(pos, axpys_phases);
        p.axpys_lists[axpys0 + slot] = uint32_t(staged_neuron(w)) | uint32_t(t) << kNeuronBits;
        reinterpret_cast<int32_t*>(row_words<T>(p, row0 + t))[p.slices * p.e_max + staged_entry(w)] =
            int32_t(axpys0 + slot);
      },
      lane);
  // Pad slots (h = 0) name their phase's first neuron: one access with it, where a neuron of
  // its own could take a bank position another slot of the phase needs.
  for (int i = lane; i < axpys_phases * kPhase; i += kWarpSize) {
    const int phase = i / kPhase, row = i % kPhase;
    if (row * axpys_phases + phase >= total)
      p.axpys_lists[axpys0 + i] = phase < total ? p.axpys_lists[axpys0 + phase * kPhase] & 0xffffu : 0u;
  }
  if (p.slices == 0) return;

  // Dots: each group's rotations, then its entries sorted by rotated bank key (the resident
  // row's index mod 8, XOR the row's tau) and dealt over the group's phases.
  const int group_rows = p.tiles_per_group * tw.shape.tile;
  auto group_of = [&](uint32_t w) { return staged_neuron(w) / group_rows; };
  auto bank_key = [&](uint32_t w) { return (staged_neuron(w) - group_of(w) * group_rows) % kBankKeys; };
  for (int i = lane; i < p.groups * Cfg::kTokens * kBankKeys; i += kWarpSize) key_counts[i] = 0;
  __syncwarp();
  for (int i = lane; i < total; i += kWarpSize) {
    const uint32_t w = stage[i];
    atomicAdd(&key_counts[(group_of(w) * Cfg::kTokens + staged_token(w)) * kBankKeys + bank_key(w)], 1);
  }
  __syncwarp();
  for (int g = 0; g < p.groups; ++g) {
    const uint32_t taus = choose_taus(key_counts + g * Cfg::kTokens * kBankKeys, lane);
    if (lane == 0) {
      group_tau[g] = taus;
      p.dots_taus[g * batches + b] = taus;
    }
  }
  __syncwarp();
  auto rotated_key = [&](uint32_t w) {
    const int g = group_of(w);
    return g * kBankKeys + (bank_key(w) ^ int(group_tau[g] >> (3 * staged_token(w)) & 7u));
  };
  sort_entries(
      stage, total, p.groups * kBankKeys, count, start, rotated_key,
      [&](uint32_t w, int pos) {
        const int g = group_of(w);
        const int first = start[g * kBankKeys], n_g = start[(g + 1) * kBankKeys] - first;
        const int phases = (n_g + kTileSlots - 1) / kTileSlots * 2;
        const uint32_t in_group = uint32_t(staged_neuron(w) - g * group_rows);
        p.dots_lists[group_offset[g] + dealt_slot(pos - first, phases)] =
            in_group | uint32_t(staged_token(w)) << 12 | uint32_t(staged_entry(w)) << 16;
      },
      lane);
  // Pad slots: their phase's first entry's neuron and row (the same address, rotation included).
  for (int g = 0; g < p.groups; ++g) {
    const int n_g = start[(g + 1) * kBankKeys] - start[g * kBankKeys];
    const int phases = (n_g + kTileSlots - 1) / kTileSlots * 2;
    uint32_t* list = p.dots_lists + group_offset[g];
    for (int i = lane; i < phases * kPhase; i += kWarpSize) {
      const int phase = i / kPhase, row = i % kPhase;
      if (row * phases + phase >= n_g) list[i] = (phase < n_g ? list[phase * kPhase] & 0xffffu : 0u) | kPadEntry << 16;
    }
  }
}

// Reduce pass (a warp per row): each resident row's h = g * (its partial dots summed in slice
// order) or g (plain), rounded once, into the high half of its axpys slot.
template <typename T>
__global__ void __launch_bounds__(Cfg::kListWarps* kWarpSize) reduce_kernel(Params p) {
  chain_entry();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = int64_t(blockIdx.x) * Cfg::kListWarps + threadIdx.x / kWarpSize;
  if (row >= p.rows || p.row_entries[row] <= 0) return;
  const float* partial = row_words<T>(p, row);
  const auto* slots = reinterpret_cast<const int32_t*>(partial) + p.slices * p.e_max;
  const auto* values = static_cast<const T*>(p.tw.values);
  auto* h_out = reinterpret_cast<T*>(p.axpys_lists);
  int seen = 0;
  warp_rows::for_each_entry_group(p.tw, row, lane, [&](int, int64_t slot, int count) {
    const int j = seen + lane;
    if (lane < count) {
      float h = Elem<T>::to_float(values[slot]);
      if (p.slices > 0) {
        float dot = 0.0f;
        for (int s = 0; s < p.slices; ++s) dot += partial[s * p.e_max + j];
        h *= dot;
      }
      h_out[int64_t(slots[j]) * 2 + 1] = Elem<T>::from_float(h);
    }
    seen += count;
  });
}

// ------------------------------------------------------------------------------------------------
// Dots.

// The resident block of a dots CTA: row r (the group's r-th neuron) is 256 bytes, 16 chunks of 16
// bytes; chunk c sits in the row's line c / 8 at position (c % 8) ^ (r % 8). Its K order is
// permuted so that one 8-byte load of x gives a lane both B fragment registers of an mma step
// and an even rotation of the chunks is a choice of load address: chunk c, word q holds columns
// 16 (c / 2) + 4 q + 2 (c % 2) and + 1.
template <typename T>
__device__ __forceinline__ void load_dots_block(const Params& p, char* block, int64_t n0, int64_t col0) {
  const int group_rows = p.tiles_per_group * p.tw.shape.tile;
  const T* up = static_cast<const T*>(p.up);
  for (int idx = threadIdx.x; idx < group_rows * 16; idx += blockDim.x) {
    const int r = idx / 16, piece = idx % 16;  // columns 8 piece .. + 8 of the slice
    uint4 v = make_uint4(0, 0, 0, 0);
    if (n0 + r < p.n) v = load_readonly(up + (n0 + r) * p.k + col0 + 8 * piece);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 8 * piece + 2 * i;  // = 16 m + 4 q + 2 e: chunk 2 m + e, word q
      const int c = 2 * (col / 16) + col % 4 / 2, q = col % 16 / 4;
      *reinterpret_cast<uint32_t*>(block + r * kDotsRowBytes + (c / 8) * 128 + (((c % 8) ^ (r % 8)) << 4) + q * 4) =
          words[i];
    }
  }
}

// A warp's stream of list bytes [begin, end) through a ring of kStages steps of kListBytes in
// shared memory (cp.async, a 16-byte copy per lane per step); at(step) makes a step resident,
// steps taken in order.
template <int kStages>
struct ListRing {
  char* smem;
  const char* src;
  int64_t begin, end;
  int lane;
  int resident = -1;

  __device__ void issue(int step) const {
    const int64_t at = begin + int64_t(step) * Cfg::kListBytes + lane * 16;
    cp_async_16(smem + (step % kStages) * Cfg::kListBytes + lane * 16, src + at, at < end);
  }
  __device__ void start() const {
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      issue(st);
      cp_async_commit();
    }
  }
  __device__ const char* at(int step) {
    if (step != resident) {  // the next step: recycle the last one's stage, wait for this one
      if (resident >= 0) {
        __syncwarp();
        issue(resident + kStages);
      }
      cp_async_commit();
      ++resident;
      cp_async_wait<kStages - 1>();
      __syncwarp();
    }
    return smem + (resident % kStages) * Cfg::kListBytes;
  }
};
constexpr int kDotsStages = 3;
constexpr int kAxpysStages = 4;
constexpr int kBatchesAhead = 3;  // batches whose x rows (dots) or list ends (both) are in flight
constexpr int kWordsPerStep = Cfg::kListBytes / 4;
constexpr size_t kDotsWarpBytes = size_t(kDotsStages) * Cfg::kListBytes;

template <typename T>
__global__ void __launch_bounds__(Cfg::kDotsWarps* kWarpSize, 1) dots_kernel(Params p) {
  extern __shared__ uint4 dots_smem[];
  char* block = reinterpret_cast<char*>(dots_smem);
  const int g = blockIdx.x / p.slices, slice = blockIdx.x % p.slices;
  const int64_t col0 = int64_t(slice) * Cfg::kDotsCols;
  const int group_rows = p.tiles_per_group * p.tw.shape.tile;
  // The weights are constant for the run: loaded before waiting for the list pass.
  load_dots_block<T>(p, block, int64_t(g) * group_rows, col0);
  __syncthreads();
  chain_entry();
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int tk = lane / 4, q = lane % 4, hf = lane / 16;
  const int64_t batches = num_batches(p.rows);
  const int64_t b0 = batches * warp / Cfg::kDotsWarps, b1 = batches * (warp + 1) / Cfg::kDotsWarps;
  if (b0 >= b1) return;
  const int32_t* offsets = p.dots_offsets + int64_t(g) * batches;
  const uint32_t* taus = p.dots_taus + int64_t(g) * batches;
  const int64_t word0 = offsets[b0];
  ListRing<kDotsStages> ring{block + size_t(group_rows) * kDotsRowBytes + warp * kDotsWarpBytes,
                             reinterpret_cast<const char*>(p.dots_lists), word0 * 4, int64_t(offsets[b1]) * 4, lane};
  ring.start();
  // Per batch in flight: its rows' x slices as B fragments (x[st]: mma step st's two registers
  // for the lane's row, rotated by the row's tau), the end of its list (words from word0) and its
  // rows' taus; the taus of the batch kBatchesAhead later wait in the slot for its refill, so
  // no x address waits on a load. Each slot is refilled in place, never moved.
  struct Slot {
    uint2 x[8];
    int end;
    uint32_t taus, next_taus;
  } slot[kBatchesAhead];
  const T* x = static_cast<const T*>(p.x) + col0 + 4 * q;
  auto load = [&](int64_t b, Slot& sl) {
    if (b >= b1) return;
    const int64_t row = b * Cfg::kTokens + tk;
    const int half_tau = int(sl.next_taus >> (3 * tk) & 7u) / 2;
#pragma unroll
    for (int st = 0; st < 8; ++st)
      sl.x[st] = row < p.rows ? __ldg(reinterpret_cast<const uint2*>(x + row * p.k + 16 * (st ^ half_tau)))
                              : make_uint2(0, 0);
    sl.end = int(offsets[b + 1] - word0);
    sl.taus = sl.next_taus;
    sl.next_taus = b + kBatchesAhead < b1 ? taus[b + kBatchesAhead] : 0u;
  };
#pragma unroll
  for (int i = 0; i < kBatchesAhead; ++i) {
    slot[i].next_taus = b0 + i < b1 ? taus[b0 + i] : 0u;
    load(b0 + i, slot[i]);
  }
  const unsigned block_at = unsigned(__cvta_generic_to_shared(block));
  const int row_bytes = int(p.n * int64_t(sizeof(T)));
  int pos = 0;  // the next tile's first word
  for (int64_t b = b0; b < b1; b += kBatchesAhead) {
#pragma unroll
    for (int i = 0; i < kBatchesAhead; ++i) {
      Slot& sl = slot[i];
      if (b + i < b1) {
        char* partials = static_cast<char*>(p.hidden) + (b + i) * Cfg::kTokens * int64_t(row_bytes) +
                         int64_t(slice) * p.e_max * 4;
        // Two tiles at a time where the batch has them in one ring step: two independent mma
        // chains in flight.
        while (pos < sl.end) {
          const bool two = pos + kTileSlots < sl.end && (pos + kTileSlots) % kWordsPerStep != 0;
          const char* words = ring.at(pos / kWordsPerStep) + (pos % kWordsPerStep) * 4;
          const char* words2 = two ? words + kTileSlots * 4 : words;
          unsigned row_at[2];
          uint32_t key[2];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const uint32_t w = *reinterpret_cast<const uint32_t*>((u ? words2 : words) + (lane % kTileSlots) * 4);
            const uint32_t in_group = w & 0xfffu;
            key[u] = uint32_t(hf) ^ (in_group % 8) ^ (sl.taus >> (3 * (w >> 12 & 7u)) & 7u);
            row_at[u] = block_at + in_group * kDotsRowBytes;
          }
          float d[2][4] = {};
#pragma unroll
          for (int st = 0; st < 8; ++st) {  // chunks 2 st (lanes 0-15) and 2 st + 1 (16-31)
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              uint32_t a[4];
              ldmatrix_x4_at<false>(a, row_at[u] + (st / 4) * 128 + (((2u * (st % 4)) ^ key[u]) << 4));
              mma_16816<T>(d[u], a, sl.x[st].x, sl.x[st].y);
            }
          }
          // Entry i's dot is D[i][its row]: lane 4 (i % 8) + row / 2 holds it.
          auto store = [&](uint32_t word, float even, float odd) {
            const uint32_t j = word >> 16;
            const int t = int(word >> 12 & 7u);
            if (j != kPadEntry && t / 2 == q)
              *reinterpret_cast<float*>(partials + t * row_bytes + int(j) * 4) = t % 2 ? odd : even;
          };
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            if (u == 1 && !two) break;
            const char* wd = u ? words2 : words;
            store(*reinterpret_cast<const uint32_t*>(wd + (lane / 4) * 4), d[u][0], d[u][1]);
            store(*reinterpret_cast<const uint32_t*>(wd + (lane / 4 + 8) * 4), d[u][2], d[u][3]);
          }
          pos += two ? 2 * kTileSlots : kTileSlots;
        }
      }
      load(b + i + kBatchesAhead, sl);
    }
  }
  cp_async_wait<0>();
}

// ------------------------------------------------------------------------------------------------
// Axpys.

// The resident block of an axpys CTA: Wd row n over the slice (32 bytes, 2 chunks) in 128-byte
// line n / 4, chunk c at position axpys_key(n) ^ c.
__host__ __device__ __forceinline__ size_t axpys_block_bytes(int64_t n) { return size_t((n + 3) / 4) * 128; }
constexpr int kAxpysWarpBytes = kAxpysStages * Cfg::kListBytes + Cfg::kTokens * Cfg::kAxpysCols * 2;
constexpr int kTileBytes = kTileSlots * 4;
constexpr int kTilesPerStep = Cfg::kListBytes / kTileBytes;

// The B fragment register of two slots (k and k + 1) for the lane's row: each slot's h where the
// slot is of that row, else 0.
__device__ __forceinline__ uint32_t slot_pair(uint2 w, uint32_t row) {
  const uint32_t lo = (w.x >> kNeuronBits & 7u) == row ? w.x >> 16 : 0u;
  const uint32_t hi = (w.y >> kNeuronBits & 7u) == row ? w.y & 0xffff0000u : 0u;
  return lo | hi;
}

template <typename T>
__global__ void __launch_bounds__(Cfg::kAxpysWarps* kWarpSize, 1) axpys_kernel(Params p) {
  extern __shared__ uint4 axpys_smem[];
  char* block = reinterpret_cast<char*>(axpys_smem);
  const int64_t col0 = int64_t(blockIdx.x) * Cfg::kAxpysCols;
  const T* down = static_cast<const T*>(p.down);
  for (int64_t idx = threadIdx.x; idx < p.n * 2; idx += blockDim.x) {
    const int n = int(idx / 2), c = int(idx % 2);
    *reinterpret_cast<uint4*>(block + (n / 4) * 128 + ((axpys_key(n) ^ c) << 4)) =
        load_readonly(down + int64_t(n) * p.k + col0 + 8 * c);
  }
  __syncthreads();
  chain_entry();
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const uint32_t tk = lane / 4;
  const int q = lane % 4;
  const int64_t batches = num_batches(p.rows);
  const int64_t b0 = batches * warp / Cfg::kAxpysWarps, b1 = batches * (warp + 1) / Cfg::kAxpysWarps;
  if (b0 >= b1) return;
  char* warp_smem = block + axpys_block_bytes(p.n) + size_t(warp) * kAxpysWarpBytes;
  T* ystage = reinterpret_cast<T*>(warp_smem + kAxpysStages * Cfg::kListBytes);
  const int64_t word0 = p.axpys_offsets[b0];
  ListRing<kAxpysStages> ring{warp_smem, reinterpret_cast<const char*>(p.axpys_lists), word0 * 4,
                              int64_t(p.axpys_offsets[b1]) * 4, lane};
  ring.start();
  // Per batch in flight: the end of its tiles (from word0) and, lanes 0-15, its row lane / 2's
  // entry count (-1: the backup's row, whose y this stage leaves alone).
  struct Slot {
    int end;
    int row_state;
  } slot[kBatchesAhead];
  auto load = [&](int64_t b, Slot& sl) {
    if (b >= b1) return;
    const int64_t row = b * Cfg::kTokens + lane / 2;
    sl.row_state = lane < 16 && row < p.rows ? p.row_entries[row] : -1;
    sl.end = int((p.axpys_offsets[b + 1] - word0) / kTileSlots);
  };
#pragma unroll
  for (int i = 0; i < kBatchesAhead; ++i) load(b0 + i, slot[i]);
  const unsigned block_at = unsigned(__cvta_generic_to_shared(block));
  const int my_slot = (lane % kPhase + kPhase * (lane / 16)) * 4;  // this lane's ldmatrix row
  const int chunk = (lane / 8) % 2;
  T* y = static_cast<T*>(p.y) + col0 + 8 * (lane % 2);
  int tile = 0;
  for (int64_t b = b0; b < b1; b += kBatchesAhead) {
#pragma unroll
    for (int i = 0; i < kBatchesAhead; ++i) {
      Slot& sl = slot[i];
      if (b + i < b1) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (; tile < sl.end; ++tile) {
          const char* words = ring.at(tile / kTilesPerStep) + (tile % kTilesPerStep) * kTileBytes;
          const int neuron = int(*reinterpret_cast<const uint32_t*>(words + my_slot) & (Cfg::kMaxNeurons - 1));
          uint32_t a[4];
          ldmatrix_x4_at<true>(a, block_at + (neuron / 4) * 128 + ((axpys_key(neuron) ^ chunk) << 4));
          const uint2 lo = *reinterpret_cast<const uint2*>(words + 8 * q);       // slots 2q, 2q + 1
          const uint2 hi = *reinterpret_cast<const uint2*>(words + 32 + 8 * q);  // slots 2q + 8, 2q + 9
          mma_16816<T>(d, a, slot_pair(lo, tk), slot_pair(hi, tk));
        }
        // D is y^T over the slice: lane holds columns lane / 4 and + 8 of rows 2q and 2q + 1.
        const int col = lane / 4;
        ystage[(2 * q) * Cfg::kAxpysCols + col] = Elem<T>::from_float(d[0]);
        ystage[(2 * q + 1) * Cfg::kAxpysCols + col] = Elem<T>::from_float(d[1]);
        ystage[(2 * q) * Cfg::kAxpysCols + col + 8] = Elem<T>::from_float(d[2]);
        ystage[(2 * q + 1) * Cfg::kAxpysCols + col + 8] = Elem<T>::from_float(d[3]);
        __syncwarp();
        if (sl.row_state >= 0)  // lanes 0-15: row lane / 2, columns 8 (lane % 2) .. + 8
          *reinterpret_cast<uint4*>(y + ((b + i) * Cfg::kTokens + lane / 2) * p.k) =
              *reinterpret_cast<const uint4*>(ystage + (lane / 2) * Cfg::kAxpysCols + 8 * (lane % 2));
        __syncwarp();
      }
      load(b + i + kBatchesAhead, sl);
    }
  }
  cp_async_wait<0>();
}

// ------------------------------------------------------------------------------------------------
// Host.

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* what) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
             "InferencePlan::run", what);
}

template <typename T>
void launch_typed(const ResidentArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  (void)dev;
  const CompactArgs& c = a.compact;
  const ResidentShape& r = a.shape;
  Params p{};
  p.kind = c.kind;
  p.rows = c.twell.shape.rows;
  p.k = c.hidden;
  p.n = c.twell.shape.cols;
  p.tw = c.twell;
  p.tiles_per_group = r.tiles_per_group;
  p.groups = r.groups;
  p.slices = r.slices;
  p.e_max = r.e_max;
  p.x = c.x;
  p.up = c.up;
  p.down = c.down;
  p.y = c.y;
  p.hidden = a.hidden;
  p.heavy_rows = a.heavy_rows;
  p.num_heavy = &a.control->num_heavy;
  p.row_entries = a.row_entries;
  p.dots_offsets = a.dots_offsets;
  p.axpys_offsets = a.axpys_offsets;
  p.dots_taus = a.dots_taus;
  p.dots_lists = a.dots_lists;
  p.axpys_lists = a.axpys_lists;
  const int64_t batches = num_batches(p.rows);
  const auto list_ctas = unsigned((batches + Cfg::kListWarps - 1) / Cfg::kListWarps);
  constexpr int kListThreads = Cfg::kListWarps * kWarpSize;
  launch(count_kernel<T>, dim3(list_ctas), dim3(kListThreads), 0, s, p);
  launch(scan_kernel, dim3(2), dim3(kScanThreads), 0, s, r.slices > 0 ? p.dots_offsets : nullptr,
         int64_t(r.groups) * batches, p.axpys_offsets, batches);
  allow_smem(fill_kernel<T>, r.list_smem, "resident list kernel shared memory");
  launch(fill_kernel<T>, dim3(list_ctas), dim3(kListThreads), r.list_smem, s, p);
  if (r.slices > 0) {
    allow_smem(dots_kernel<T>, r.dots_smem, "resident dots kernel shared memory");
    launch(dots_kernel<T>, dim3(unsigned(r.dots_ctas)), dim3(Cfg::kDotsWarps * kWarpSize), r.dots_smem, s, p);
  }
  launch(reduce_kernel<T>, dim3(unsigned((p.rows + Cfg::kListWarps - 1) / Cfg::kListWarps)), dim3(kListThreads), 0,
         s, p);
  allow_smem(axpys_kernel<T>, r.axpys_smem, "resident axpys kernel shared memory");
  launch(axpys_kernel<T>, dim3(unsigned(r.axpys_ctas)), dim3(Cfg::kAxpysWarps * kWarpSize), r.axpys_smem, s, p);
}

size_t round_bytes(size_t v) { return (v + 255) / 256 * 256; }

}  // namespace

ResidentShape resident_shape(const ProblemDims& d, const DeviceInfo& dev) {
  ResidentShape r;
  const size_t optin = size_t(std::max(dev.smem_optin, 0));
  const size_t smem = optin > Cfg::kSmemReserve ? optin - Cfg::kSmemReserve : 0;
  const bool gated = d.kind == FfnKind::gated;
  if (d.k % Cfg::kDotsCols != 0) {
    r.reason = "K a multiple of " + std::to_string(Cfg::kDotsCols);
    return r;
  }
  if (d.n > Cfg::kMaxNeurons) {
    r.reason = "N at most " + std::to_string(Cfg::kMaxNeurons);
    return r;
  }
  r.axpys_ctas = int32_t(d.k / Cfg::kAxpysCols);
  r.axpys_smem = axpys_block_bytes(d.n) + size_t(Cfg::kAxpysWarps) * kAxpysWarpBytes;
  if (r.axpys_smem > smem) {
    r.reason = "N x " + std::to_string(kAxpysRowBytes) + " bytes of the down weight (plus staging) within the " +
               std::to_string(smem) + " bytes of shared memory a block may use";
    return r;
  }
  const size_t es = dtype_size(d.dtype);
  const int64_t row_words = d.n * int64_t(es) / 4;  // 32-bit words of a G row
  if (gated) {
    r.slices = int32_t(d.k / Cfg::kDotsCols);
    const size_t staging = size_t(Cfg::kDotsWarps) * kDotsWarpBytes;
    const size_t block = smem > staging ? smem - staging : 0;
    r.tiles_per_group = int32_t(std::min<size_t>(block / (size_t(d.tile) * kDotsRowBytes), size_t(4096 / d.tile)));
    if (r.tiles_per_group < 1) {
      r.reason = "a TwELL tile of up weight rows over " + std::to_string(Cfg::kDotsCols) + " columns in shared memory";
      return r;
    }
    r.groups = int32_t((d.num_tiles() + r.tiles_per_group - 1) / r.tiles_per_group);
    if (r.groups > kMaxGroups) {
      r.reason = "at most " + std::to_string(kMaxGroups) + " neuron groups of the up weight";
      return r;
    }
    r.tiles_per_group = int32_t((d.num_tiles() + r.groups - 1) / r.groups);  // balanced groups
    r.groups = int32_t((d.num_tiles() + r.tiles_per_group - 1) / r.tiles_per_group);
    r.dots_ctas = r.groups * r.slices;
    r.dots_smem = size_t(r.tiles_per_group) * d.tile * kDotsRowBytes + staging;
    r.e_max = int32_t(std::min<int64_t>(row_words / (r.slices + 1), Cfg::kMaxEntries));
  } else {
    r.e_max = int32_t(std::min<int64_t>(row_words, Cfg::kMaxEntries));
  }
  if (r.e_max < Cfg::kMinEntries) {
    r.reason = "G rows holding at least " + std::to_string(Cfg::kMinEntries) + " entries' partial dots (N >= " +
               std::to_string(int64_t(Cfg::kMinEntries) * (r.slices + 1) * 4 / int64_t(es)) + ")";
    return r;
  }
  r.list_smem = size_t(Cfg::kListWarps) * fill_warp_words(r.e_max) * 4;
  if (r.list_smem > smem) {
    r.reason = "the list pass's staging in shared memory";
    return r;
  }
  r.max_rows = (int64_t(INT32_MAX) - 4096) / (r.e_max + 2 * int64_t(r.groups) + 16);
  const int sms = dev.sm_count;
  r.fills_chip = 2 * r.axpys_ctas >= sms && r.axpys_ctas <= sms &&
                 (!gated || (2 * r.dots_ctas >= sms && r.dots_ctas <= sms));
  r.ok = true;
  return r;
}

ResidentRegions resident_regions(const ResidentShape& r, int64_t rows) {
  ResidentRegions g;
  const size_t m = size_t(rows), batches = size_t(num_batches(rows));
  g.row_entries = round_bytes(m * 4);
  g.dots_offsets = round_bytes((size_t(r.groups) * batches + 1) * 4);
  g.axpys_offsets = round_bytes((batches + 1) * 4);
  g.dots_taus = round_bytes(size_t(r.groups) * batches * 4);
  // A batch's lists are its entries rounded up to whole tiles of 16 (the dots one per group).
  if (r.slices > 0) g.dots_lists = round_bytes((m * size_t(r.e_max) + 15 * size_t(r.groups) * batches) * 4);
  g.axpys_lists = round_bytes((m * size_t(r.e_max) + 15 * batches) * 4);
  return g;
}

void launch_resident_rows(const ResidentArgs& a, const DeviceInfo& dev, cudaStream_t s) {
  if (a.compact.twell.shape.rows == 0) return;
  if (!a.shape.ok) throw Error("InferencePlan::run", "options.row_stage", "a layer the resident stage takes", a.shape.reason);
  with_element_type(a.compact.twell.dtype, "InferencePlan::run", [&](auto tag) { launch_typed<decltype(tag)>(a, dev, s); });
  check_launch("InferencePlan::run", "resident row kernels");
}

}  // namespace twell::gpu
