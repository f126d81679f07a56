// A K-wide row owned by one CTA: the kernel family of inference's compact up+down
// (compact_ffn.cu) and of training's compact-row passes where the warp kernels do not take K
// (forward_rows.cu, backward_rows.cu, through train_rows.cuh's run_pass).
// - host: the CTA shape over a K-wide row (row_shape) and the launch of a kernel template
//   <T, kKind, kVecs> with it (dispatch_rows);
// - device: thread t owns the 16-byte vectors v = t + j * blockDim (j < kVecs) of K, held as fp32
//   [kVecs][kVecElems] (loads, stores, dots and axpys over them); the row's tile counts are staged
//   in shared memory and every thread walks the same cursor over its TwELL entries, kBatch at a
//   time; a batch of dot products is summed over the CTA in a fixed order (shuffles, then the
//   warps in warp order).
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/kernels/common/element.cuh"
#include "cuda/kernels/common/warp.cuh"
#include "cuda/policy/config.hpp"
#include "twell/dtype.hpp"
#include "twell/error.hpp"
#include "twell/ffn.hpp"
#include "twell/format.hpp"

namespace twell::gpu::rows {

constexpr int kBatch = CtaRowConfig::kBatch;
constexpr int kMaxWarps = CtaRowConfig::kMaxWarps;

static_assert(CtaRowConfig::kMaxThreads % kWarpSize == 0 && CtaRowConfig::kMaxThreads <= 1024,
              "the CTA ceiling must be whole warps within the CTA size limit");
static_assert(ShapeLimits::kMaxHidden / kVecElems <=
                  int64_t(CtaRowConfig::kMaxThreads) * CtaRowConfig::kVectorsPerThread,
              "the largest K must fit one CTA");

// Host: vectors per thread (1, 2 or kVectorsPerThread) and threads per CTA for a K-wide row.
// Small K: one warp; larger K: kVectorsPerThread per thread, as many warps as that takes.
struct RowShape {
  int vecs = 1;
  int threads = kWarpSize;
};
inline RowShape row_shape(int64_t k) {
  const int64_t vectors = k / kVecElems;
  RowShape r;
  r.vecs = vectors <= kWarpSize ? 1 : vectors <= 2 * kWarpSize ? 2 : CtaRowConfig::kVectorsPerThread;
  const int64_t owners = (vectors + r.vecs - 1) / r.vecs;
  r.threads = int((owners + kWarpSize - 1) / kWarpSize * kWarpSize);
  return r;
}

// Host: calls launch(T{}, kind constant, vecs constant, threads) with the element type of `dtype`,
// the FFN kind and the vectors per thread of row_shape(k) as compile-time constants, so a kernel
// template <T, kKind, kVecs> is instantiated once per combination and launched with its CTA size.
// Throws for a K past one CTA (the plans reject it first).
template <typename Launch>
void dispatch_rows(DType dtype, FfnKind kind, int64_t k, const char* op, Launch&& launch) {
  const RowShape shape = row_shape(k);
  if (shape.threads > CtaRowConfig::kMaxThreads)
    throw Error(op, "hidden size K", "at most " + std::to_string(ShapeLimits::kMaxHidden), std::to_string(k));
  with_element_type(dtype, op, [&](auto tag) {
    auto by_vecs = [&](auto kind_c) {
      switch (shape.vecs) {
        case 1: return launch(tag, kind_c, std::integral_constant<int, 1>{}, shape.threads);
        case 2: return launch(tag, kind_c, std::integral_constant<int, 2>{}, shape.threads);
        default:
          return launch(tag, kind_c, std::integral_constant<int, CtaRowConfig::kVectorsPerThread>{},
                        shape.threads);
      }
    };
    if (kind == FfnKind::gated)
      by_vecs(std::integral_constant<FfnKind, FfnKind::gated>{});
    else
      by_vecs(std::integral_constant<FfnKind, FfnKind::plain>{});
  });
}

// The thread's j-th vector of the row.
__device__ __forceinline__ int64_t thread_vector(int j) { return threadIdx.x + int64_t(j) * blockDim.x; }

// Loads the thread's vectors of a K-wide row as floats (zeros past K).
template <typename T, int kVecs>
__device__ __forceinline__ void load_row(const T* row, int64_t vectors, float (&out)[kVecs][kVecElems]) {
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t v = thread_vector(j);
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) out[j][e] = 0.0f;
    if (v < vectors) unpack8<T>(load_readonly(row + v * kVecElems), out[j]);
  }
}

// Stores the thread's vectors of a K-wide row, rounded to T.
template <typename T, int kVecs>
__device__ __forceinline__ void store_row(T* row, int64_t vectors, const float (&in)[kVecs][kVecElems]) {
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t v = thread_vector(j);
    if (v < vectors) *reinterpret_cast<uint4*>(row + v * kVecElems) = pack8<T>(in[j]);
  }
}

// Calls f(j, v) for each of the thread's vectors j whose index v is below `vectors`, in order of j.
template <int kVecs, typename F>
__device__ __forceinline__ void for_each_vector(int64_t vectors, F&& f) {
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t v = thread_vector(j);
    if (v >= vectors) continue;
    f(j, v);
  }
}

// acc += coef * w[neuron] over the thread's vectors.
template <typename T, int kVecs>
__device__ __forceinline__ void axpy_row(float coef, const T* w, int64_t vectors,
                                         float (&acc)[kVecs][kVecElems]) {
  for_each_vector<kVecs>(vectors, [&](int j, int64_t v) {
    float wf[kVecElems];
    unpack8<T>(load_readonly(w + v * kVecElems), wf);
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) acc[j][e] = fmaf(coef, wf[e], acc[j][e]);
  });
}

// The thread's part of <r, w> over its vectors.
template <typename T, int kVecs>
__device__ __forceinline__ float partial_dot(const float (&r)[kVecs][kVecElems], const T* w,
                                             int64_t vectors) {
  float dot = 0.0f;
  for_each_vector<kVecs>(vectors, [&](int j, int64_t v) {
    float wf[kVecElems];
    unpack8<T>(load_readonly(w + v * kVecElems), wf);
#pragma unroll
    for (int e = 0; e < kVecElems; ++e) dot = fmaf(r[j][e], wf[e], dot);
  });
  return dot;
}

// Sums each dot[b] over the CTA (shuffles, then across warps in a fixed order, through
// partial[buffer]: double-buffered, one barrier per batch); every thread ends with the same totals.
// Must be reached by every thread of the CTA.
template <int kWarpSlots, int kDots>
__device__ __forceinline__ void reduce_batch(float (&dot)[kDots], float (&partial)[2][kWarpSlots][kDots],
                                             int& buffer) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int warps = blockDim.x / kWarpSize;
#pragma unroll
  for (int b = 0; b < kDots; ++b) dot[b] = warp_sum(dot[b]);
  if (warps == 1) return;
  if (lane == 0)
#pragma unroll
    for (int b = 0; b < kDots; ++b) partial[buffer][warp][b] = dot[b];
  __syncthreads();  // the other buffer is rewritten only after the next batch's barrier
#pragma unroll
  for (int b = 0; b < kDots; ++b) {
    float sum = 0.0f;
    for (int w = 0; w < warps; ++w) sum += partial[buffer][w][b];
    dot[b] = sum;
  }
  buffer ^= 1;
}

// Shared memory of a row kernel, two __shared__ arrays: the row's tile counts, and the cross-warp
// partial dots of a batch (double-buffered: one barrier per batch). Their order of declaration
// moves a kernel's registers by a few either way; each kernel keeps the order that gives it fewest.
using RowCounts = uint16_t[CtaRowConfig::kMaxTiles];
using BatchPartials = float[2][kMaxWarps][kBatch];

// Stages the row's tile counts; the caller synchronises before the cursor reads them.
__device__ __forceinline__ void stage_counts(RowCounts& counts, const TwellView& tw, int64_t row, int num_tiles) {
  for (int t = threadIdx.x; t < num_tiles; t += blockDim.x) counts[t] = tw.counts[row * num_tiles + t];
}

// A row's entries, kBatch at a time, in TwELL order (tiles ascending, columns ascending within a
// tile). Every thread of the CTA walks the same cursor, so batches are uniform without a broadcast.
struct EntryCursor {
  int tile = 0;
  int index = 0;

  // Fills neuron[b] and entry[b] = at(the entry's slot) for b < the returned count (unused ones get
  // neuron 0 and E{}).
  template <typename E, typename At>
  __device__ __forceinline__ int next(const RowCounts& counts, int num_tiles, const TwellView& tw, int64_t row,
                                      int (&neuron)[kBatch], E (&entry)[kBatch], At&& at) {
    int taken = 0;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      while (tile < num_tiles && index >= counts[tile]) {
        ++tile;
        index = 0;
      }
      neuron[b] = 0;
      entry[b] = E{};
      if (tile < num_tiles) {
        const int64_t slot = (row * num_tiles + tile) * tw.shape.capacity + index;
        neuron[b] = tile * tw.shape.tile + tw.cols[slot];
        entry[b] = at(slot);
        ++index;
        taken = b + 1;
      }
    }
    return taken;
  }
};

// Calls f(neuron, entry, taken) for each batch of up to kBatch entries of `row`, in TwELL order,
// entry[b] = at(slot) for each entry's slot (E{} past `taken`; E is what `at` returns). The row's
// counts are staged by stage_counts and published by a barrier. Every thread of the CTA.
template <typename At, typename F>
__device__ __forceinline__ void for_each_batch(const RowCounts& counts, int num_tiles, const TwellView& tw,
                                               int64_t row, At&& at, F&& f) {
  using E = decltype(at(int64_t{}));
  EntryCursor cur;
  for (;;) {
    int neuron[kBatch];
    E entry[kBatch];
    const int taken = cur.next(counts, num_tiles, tw, row, neuron, entry, at);
    if (taken == 0) return;
    f(neuron, entry, taken);
  }
}

// for_each_batch with entry[b] the entry's slot (0 past `taken`).
template <typename F>
__device__ __forceinline__ void for_each_batch(const RowCounts& counts, int num_tiles, const TwellView& tw,
                                               int64_t row, F&& f) {
  for_each_batch(counts, num_tiles, tw, row, [](int64_t slot) { return slot; }, f);
}

// dot[b] = <row, weight[neuron[b]]> for the batch's b < taken (0 past them), summed over the CTA:
// `row` is the thread's vectors of a K-wide row. Every thread of the CTA; all end with the totals.
template <typename T, int kVecs>
__device__ __forceinline__ void batch_dots(const float (&row)[kVecs][kVecElems], const T* weight,
                                           const int (&neuron)[kBatch], int taken, int64_t k,
                                           BatchPartials& partial, int& buffer, float (&dot)[kBatch]) {
#pragma unroll
  for (int b = 0; b < kBatch; ++b)
    dot[b] = b < taken ? partial_dot<T, kVecs>(row, weight + int64_t(neuron[b]) * k, k / kVecElems) : 0.0f;
  reduce_batch(dot, partial, buffer);
}

}  // namespace twell::gpu::rows
