// twell_l2_gather: the L2 gather ceiling of the row stage on this GPU, alone and beside a GEMM.
//
// The sparse path's dots and axpys kernels each read one weight row of K values per active entry,
// in random row order, from a weight matrix that stays in L2. This tool times only that: warps
// gather `entries` random rows of a [rows, k] bf16 matrix (16-byte loads, every byte XORed into a
// register so nothing is optimised away; no other arithmetic), best of 10 passes after one that
// warms L2, over a sweep of CTAs per SM and rows in flight per warp. Compare the best with a row
// kernel's time (ncu) to see how far it is from the hardware's gather rate.
//
// --beside-gemm: whether the row stage could hide under the gate GEMM if the two shared the GPU.
// It times the gate-shaped GEMM relu(x W^T) (x [m, k], W [rows, k], bf16, fp32 accumulation,
// cuBLASLt) alone on every SM and with CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET = G, the gather
// alone (here from a shared queue, so CTAs that start late take less), both in sequence, and both
// launched together on two streams (GEMM sized for G SMs first, the gather's grid for the other
// SMs), for several G; then again with the split made by green contexts (G SMs for the GEMM's
// stream, the rest for the gather's). Its gather defaults to both row kernels' rows (2x).
//
// --matrices C: the gathered rows are spread over C matrices of [rows, k] (one buffer of C rows
// times as many), so that C = 2 beside the GEMM holds in L2 what a three-way overlap would (Wg
// read by the GEMM, Wu and Wd gathered at once).
//
// On compute capability 9.0 the gather also runs as bulk copies: each warp keeps a ring of slots
// in shared memory, one row per slot, filled by `cp.async.bulk` and waited on through an mbarrier
// per slot, so the rows in flight per SM are bounded by shared memory, not by registers (a row
// kernel holding x or y accumulators in registers has room for 2 rows of loads per warp).
//
// --union-gemm: the tensor-core side of block-union GEMMs instead (union_gemm below).
//   twell_l2_gather [--rows N] [--k K] [--entries E] [--matrices C] [--seed S] [--beside-gemm [--m M]]
//   twell_l2_gather --union-gemm [--rows N] [--k K] [--m M]
// Defaults: M = 16384 at 0.5% of N = 5632, K = 2048 (K: multiples of 2048), C = 1.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/kernels/common/sm90.cuh"

namespace {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "twell_l2_gather: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

void check_lt(cublasStatus_t e, const char* what) {
  if (e == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "twell_l2_gather: %s: %s\n", what, cublasLtGetStatusString(e));
  std::exit(1);
}

// R rows of 2048 columns (8 16-byte vectors per lane) in flight, XORed into acc.
template <int R>
__device__ __forceinline__ void gather_rows(const uint4* __restrict__ w, int64_t row_vecs,
                                            const int32_t* __restrict__ idx, int64_t base, int64_t n,
                                            int lane, uint32_t& acc) {
  for (int64_t v0 = 0; v0 < row_vecs; v0 += 8 * 32) {
    uint4 v[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4* p = w + idx[base + r < n ? base + r : base] * row_vecs + v0 + lane;
#pragma unroll
      for (int j = 0; j < 8; ++j) v[r][j] = __ldg(p + j * 32);
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc ^= v[r][j].x ^ v[r][j].y ^ v[r][j].z ^ v[r][j].w;
  }
}

// Static schedule: warp w gathers rows w * R .. w * R + R - 1, then strides by warps * R.
template <int R>
__global__ void gather_kernel(const uint4* __restrict__ w, int64_t row_vecs, const int32_t* __restrict__ idx,
                              int64_t n, uint32_t* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  uint32_t acc = 0;
  for (int64_t base = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32 * R; base < n; base += warps * R)
    gather_rows<R>(w, row_vecs, idx, base, n, lane, acc);
  if (acc == 0x9e3779b9u) out[0] = acc;  // keeps the loads; practically never true
}

// Dynamic schedule: each warp takes the next R rows from a queue (*head, zeroed before launch).
template <int R>
__global__ void gather_queue_kernel(const uint4* __restrict__ w, int64_t row_vecs,
                                    const int32_t* __restrict__ idx, int64_t n, int* head,
                                    uint32_t* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  uint32_t acc = 0;
  while (true) {
    int64_t base = 0;
    if (lane == 0) base = atomicAdd(head, R);
    base = __shfl_sync(0xffffffffu, base, 0);
    if (base >= n) break;
    gather_rows<R>(w, row_vecs, idx, base, n, lane, acc);
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}

// Bulk-copy gather, queue-fed: each warp takes `slots` rows at a time from *head and keeps one
// row per slot of its ring in flight; a slot is read (16-byte shared loads XORed into acc), then
// refilled with the next batch's row of the same index. Shared memory: 16 barriers per warp
// (128-byte aligned block), then each warp's ring of slots x row bytes.
constexpr int kMaxSlots = 16;

__global__ void gather_bulk_kernel(const uint4* __restrict__ w, int64_t row_vecs,
                                   const int32_t* __restrict__ idx, int64_t n, int* head, int slots,
                                   uint32_t* __restrict__ out) {
#if TWELL_SM90A_DEVICE
  namespace sm = twell::gpu::sm90;
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const uint32_t row_bytes = uint32_t(row_vecs * 16);
  const uint32_t bars = sm::smem_addr(smem) + uint32_t(warp * kMaxSlots * 8);
  unsigned char* ring = smem + (warps * kMaxSlots * 8 + 127) / 128 * 128 + size_t(warp) * slots * row_bytes;
  const uint32_t ring_addr = sm::smem_addr(ring);
  if (lane < slots) sm::barrier_init(bars + 8 * lane, 1);
  sm::barrier_init_fence();
  __syncwarp();
  auto take = [&] {
    int64_t b = 0;
    if (lane == 0) b = atomicAdd(head, slots);
    return __shfl_sync(0xffffffffu, b, 0);
  };
  auto row_of = [&](int64_t base) { return lane < slots && base + lane < n ? int64_t(idx[base + lane]) : -1; };
  auto fill = [&](int s, int64_t row) {
    sm::barrier_arrive_expect(bars + 8 * s, row_bytes);
    sm::bulk_load(ring_addr + s * row_bytes, w + row * row_vecs, row_bytes, bars + 8 * s);
  };
  uint32_t acc = 0, phase = 0;
  int64_t base = take();
  const int64_t first = row_of(base);
  for (int s = 0; s < slots; ++s) {
    const int64_t r = __shfl_sync(0xffffffffu, first, s);
    if (lane == 0 && r >= 0) fill(s, r);
  }
  while (base < n) {
    const int64_t next = take();
    const int64_t rows = row_of(next);
    for (int s = 0; s < slots && base + s < n; ++s) {
      sm::barrier_wait(bars + 8 * s, phase);
      const uint4* p = reinterpret_cast<const uint4*>(ring + size_t(s) * row_bytes);
#pragma unroll 8
      for (int64_t v = lane; v < row_vecs; v += 32) {
        const uint4 x = p[v];
        acc ^= x.x ^ x.y ^ x.z ^ x.w;
      }
      __syncwarp();
      const int64_t r = __shfl_sync(0xffffffffu, rows, s);
      if (lane == 0 && r >= 0) {
        sm::fence_proxy_async_shared();
        fill(s, r);
      }
    }
    phase ^= 1;
    base = next;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
#else
  (void)w, (void)row_vecs, (void)idx, (void)n, (void)head, (void)slots, (void)out;
  __trap();
#endif
}

// Fills n bf16 values with hashed values in [-1, 1) (tensor cores run cooler, so faster, on zeros).
__global__ void fill_kernel(uint16_t* p, int64_t n, uint32_t salt) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ salt;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float v = float(h & 0xffffu) / 32768.0f - 1.0f;
    p[i] = uint16_t(__float_as_uint(v) >> 16);
  }
}

// --union-gemm: the tensor-core side of block-union GEMMs (lab/journal.md, "Block-union GEMMs").
// For a block of B tokens the union of their active neurons has N (1 - (1 - p)^B) rows on
// average; the dots half is U[union, B] = Wu[union] x[block]^T and the axpys half
// y[block] = H[block, union] Wd[union], over M / B blocks. This times both as cuBLAS strided
// batched GEMMs (bf16, fp32 compute) on stream s, timed by time_us, with one union weight block
// shared by every batch (so the weight operand is L2-resident, as gathered rows of a 23 MB matrix
// are), x and H per block, and prints them beside the bytes the union rows would take to gather:
// a fused kernel's time lies between the larger of its GEMM and gather times and their sum.
template <typename Time>
int union_gemm(const char* device, int64_t m, int64_t k, int64_t n, cudaStream_t s, Time&& time_us) {
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasSetStream(h, s) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "twell_l2_gather: cuBLAS handle\n");
    return 1;
  }
  const int64_t max_b = 128;
  uint16_t *w = nullptr, *x = nullptr, *hid = nullptr, *out = nullptr;
  const int64_t hid_elems = (m + 7) / 8 * 8 * n;  // blocks x union x B <= (M rounded) x N
  check(cudaMalloc(&w, size_t(n * k) * 2), "union weights");
  check(cudaMalloc(&x, size_t((m + max_b) * k) * 2), "x");
  check(cudaMalloc(&hid, size_t(hid_elems + max_b * n) * 2), "H");
  check(cudaMalloc(&out, size_t(hid_elems + max_b * n + (m + max_b) * k) * 2), "outputs");
  fill_kernel<<<1024, 256, 0, s>>>(w, n * k, 1u);
  fill_kernel<<<1024, 256, 0, s>>>(x, (m + max_b) * k, 2u);
  fill_kernel<<<1024, 256, 0, s>>>(hid, hid_elems + max_b * n, 3u);
  check(cudaGetLastError(), "fill");
  // One strided batched GEMM (column-major C [rows, cols] = op(A) B, depth `depth`), A shared by
  // every batch (stride 0), timed.
  auto batched = [&](cublasOperation_t op_a, int64_t rows, int64_t cols, int64_t depth, const void* b,
                     int64_t ldb, int64_t stride_b, int64_t ldc, int64_t batches, const char* what) {
    const float one = 1.0f, zero = 0.0f;
    return time_us([&] {
      if (cublasGemmStridedBatchedEx(h, op_a, CUBLAS_OP_N, int(rows), int(cols), int(depth), &one, w, CUDA_R_16BF,
                                     int(k), 0, b, CUDA_R_16BF, int(ldb), stride_b, &zero, out, CUDA_R_16BF,
                                     int(ldc), rows * cols, int(batches), CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "twell_l2_gather: %s GEMM\n", what);
        std::exit(1);
      }
    });
  };
  std::printf("%s: block-union GEMMs, M = %lld, K = %lld, N = %lld (cuBLAS strided batched, bf16, fp32 compute)\n",
              device, (long long)m, (long long)k, (long long)n);
  for (const double p : {0.005, 0.01, 0.02}) {
    for (const int64_t b : {int64_t(64), int64_t(88), int64_t(128)}) {
      const double frac = 1.0 - std::pow(1.0 - p, double(b));
      const int64_t uni = std::min<int64_t>(n, (int64_t(double(n) * frac) + 7) / 8 * 8);
      const int64_t blocks = (m + b - 1) / b;
      const double flops = 2.0 * double(blocks) * double(b) * double(uni) * double(k);
      const double bytes = double(blocks) * double(uni) * double(k) * 2;
      // dots: U [uni, b] = Wu[union] (row-major [uni, k]) x[block]^T; axpys: y[block]^T [k, b] =
      // Wd[union]^T H[block]^T.
      const double dots = batched(CUBLAS_OP_T, uni, b, k, x, k, b * k, uni, blocks, "dots");
      const double axpys = batched(CUBLAS_OP_N, k, b, uni, hid, uni, uni * b, k, blocks, "axpys");
      std::printf(
          "  p %.1f%%, B %3lld: union %4lld (reuse %.2f), %.2f GB of union rows a half (%.0f us at 8.97 TB/s, %.0f "
          "at 7.9); dots GEMM %6.1f us (%.0f TFLOP/s), axpys GEMM %6.1f us (%.0f TFLOP/s)\n",
          p * 100, (long long)b, (long long)uni, double(b) * p * double(n) / double(uni), bytes / 1e9,
          bytes / 8.97e12 * 1e6, bytes / 7.9e12 * 1e6, dots, flops / dots / 1e6, axpys, flops / axpys / 1e6);
    }
  }
  cublasDestroy(h);
  return 0;
}

int64_t arg(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::strtoll(argv[i + 1], nullptr, 10);
  return fallback;
}

bool flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

// G = relu(x W^T) through cuBLASLt, row-major (x [m, k], W [n, k], G [m, n]); one descriptor and
// algorithm per SM-count target (0: none).
struct Gemm {
  cublasLtHandle_t lt = nullptr;
  int64_t m, n, k;
  const void *x, *w;
  void *g, *ws;
  size_t ws_bytes;
  struct Plan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
  };
  std::vector<std::pair<int, Plan>> plans;

  const Plan& plan(int target) {
    for (auto& p : plans)
      if (p.first == target) return p.second;
    Plan p{};
    check_lt(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
    const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    const cublasLtEpilogue_t relu = CUBLASLT_EPILOGUE_RELU;
    check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "transa");
    check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt), "transb");
    check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &relu, sizeof relu),
             "relu");
    if (target > 0)
      check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target,
                                              sizeof target),
               "SM count target");
    // Column-major: G^T [n, m] = W [k, n]^T x [k, m].
    check_lt(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, uint64_t(k), uint64_t(n), k), "layout");
    check_lt(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, uint64_t(k), uint64_t(m), k), "layout");
    check_lt(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, uint64_t(n), uint64_t(m), n), "layout");
    cublasLtMatmulPreference_t pref;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                  sizeof ws_bytes),
             "workspace");
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    check_lt(cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.c, p.c, pref, 1, &r, &found),
             "heuristic");
    if (found < 1) {
      std::fprintf(stderr, "twell_l2_gather: no cuBLASLt algorithm\n");
      std::exit(1);
    }
    p.algo = r.algo;
    cublasLtMatmulPreferenceDestroy(pref);
    plans.emplace_back(target, p);
    return plans.back().second;
  }

  void run(int target, cudaStream_t s) {
    const Plan& p = plan(target);
    const float one = 1, zero = 0;
    check_lt(
        cublasLtMatmul(lt, p.desc, &one, w, p.a, x, p.b, &zero, g, p.c, g, p.c, &p.algo, ws, ws_bytes, s),
        "matmul");
  }
};

}  // namespace

int main(int argc, char** argv) {
  const bool beside = flag(argc, argv, "--beside-gemm");
  const int64_t rows = arg(argc, argv, "--rows", 5632), k = arg(argc, argv, "--k", 2048);
  const int64_t m = arg(argc, argv, "--m", 16384);
  const int64_t entries = arg(argc, argv, "--entries", (beside ? 2 : 1) * m * rows / 200);
  const auto seed = uint32_t(arg(argc, argv, "--seed", 1));
  const int64_t matrices = arg(argc, argv, "--matrices", 1);
  if (rows < 1 || k < 2048 || k % 2048 != 0 || entries < 1 || m < 1 || matrices < 1 || matrices > 4) {
    std::fprintf(stderr,
                 "twell_l2_gather: --rows, --m, --entries >= 1, --k a multiple of 2048, --matrices 1 to 4\n");
    return 2;
  }
  const int64_t gather_rows_n = rows * matrices;
  const int64_t row_vecs = k / 8;
  uint4* w = nullptr;
  int32_t* idx = nullptr;
  uint32_t* out = nullptr;
  int* head = nullptr;
  check(cudaMalloc(&w, size_t(gather_rows_n * k) * 2), "weights");
  check(cudaMemset(w, 1, size_t(gather_rows_n * k) * 2), "weights");
  std::vector<int32_t> host(static_cast<size_t>(entries));
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(gather_rows_n - 1));
  for (auto& r : host) r = pick(gen);
  check(cudaMalloc(&idx, host.size() * sizeof(int32_t)), "row list");
  check(cudaMemcpy(idx, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "row list");
  check(cudaMalloc(&out, sizeof(uint32_t)), "output");
  check(cudaMalloc(&head, sizeof(int)), "queue");
  int sms = 0, dev = 0;
  check(cudaGetDevice(&dev), "device");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, dev), "device properties");
  cudaStream_t sa, sb;
  check(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking), "stream");
  check(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking), "stream");
  cudaEvent_t start, stop, side;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  check(cudaEventCreate(&side), "event");
  const double bytes = double(entries) * double(k) * 2;
  // Bulk-copy gather: `warps` warps per CTA, `slots` rows in flight per warp, one launch of `ctas`
  // CTAs on stream s (compute capability 9.0 only; the caller checks bulk_ok).
  const bool bulk_ok = prop.major == 9;
  const int row_bytes = int(row_vecs * 16);
  auto bulk_smem = [&](int warps, int slots) {
    return size_t((warps * kMaxSlots * 8 + 127) / 128 * 128) + size_t(warps) * slots * row_bytes;
  };
  if (bulk_ok)
    check(cudaFuncSetAttribute(gather_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(prop.sharedMemPerBlockOptin)),
          "shared memory opt-in");
  auto bulk_fits = [&](int warps, int slots, int ctas_per_sm) {
    return slots <= kMaxSlots && bulk_smem(warps, slots) <= prop.sharedMemPerBlockOptin &&
           ctas_per_sm * (bulk_smem(warps, slots) + 1024) <= prop.sharedMemPerMultiprocessor;
  };
  auto bulk = [&](int ctas, int warps, int slots, cudaStream_t s) {
    gather_bulk_kernel<<<unsigned(ctas), unsigned(warps * 32), bulk_smem(warps, slots), s>>>(
        w, row_vecs, idx, entries, head, slots, out);
  };
  // (warps per CTA, slots per warp, CTAs per SM) tried for the bulk-copy gather.
  // On an H200 (2026-11-25) 1 x 16 x 3 ran as 2 x 8 x 3, 1 x 8 x 6 as 2 x 4 x 6, and 1 x 4 x 12
  // at half their rate (one warp's copies waited on in order).
  const int bulk_configs[][3] = {{4, 6, 2}, {8, 3, 2}, {8, 2, 3}};
  // Best of 10 timed passes after a warm-up of work(), which enqueues on streams a and b: b forks
  // from a at the start and joins it at the end.
  auto time_us = [&](cudaStream_t a, cudaStream_t b, auto&& work) {
    float best = 1e30f;
    for (int it = 0; it < 11; ++it) {
      check(cudaMemsetAsync(head, 0, sizeof(int), a), "queue");
      check(cudaEventRecord(start, a), "event");
      check(cudaStreamWaitEvent(b, start, 0), "event");
      work();
      check(cudaEventRecord(side, b), "event");
      check(cudaStreamWaitEvent(a, side, 0), "event");
      check(cudaEventRecord(stop, a), "event");
      check(cudaEventSynchronize(stop), "kernels");
      check(cudaGetLastError(), "launch");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "event");
      if (it > 0 && ms < best) best = ms;
    }
    return double(best) * 1e3;
  };
  auto tbs = [&](double us) { return bytes / (us * 1e-6) / 1e12; };
  if (flag(argc, argv, "--union-gemm"))
    return union_gemm(prop.name, m, k, rows, sa, [&](auto&& work) { return time_us(sa, sa, work); });
  std::printf(
      "%s (%d SMs): %lld random rows of %lld [%lld, %lld] bf16 matrices (%.1f MB, L2 %.1f MB), %.2f GB\n",
      prop.name, sms, (long long)entries, (long long)matrices, (long long)rows, (long long)k,
      double(gather_rows_n * k) * 2 / 1e6, prop.l2CacheSize / 1e6, bytes / 1e9);

  if (!beside) {
    double best_us = 1e30;
    auto sweep = [&](auto kernel, int in_flight, int ctas_per_sm) {
      const double us = time_us(sa, sb, [&] {
        kernel<<<unsigned(sms * ctas_per_sm), 128, 0, sa>>>(w, row_vecs, idx, entries, out);
      });
      if (us < best_us) best_us = us;
      std::printf("  %d CTAs of 4 warps per SM, %d rows in flight per warp: %8.1f us  %5.2f TB/s\n",
                  ctas_per_sm, in_flight, us, tbs(us));
    };
    for (int c : {2, 3, 4, 8}) {
      sweep(gather_kernel<1>, 1, c);
      sweep(gather_kernel<2>, 2, c);
      sweep(gather_kernel<4>, 4, c);
    }
    std::printf("best: %.1f us, %.2f TB/s\n", best_us, tbs(best_us));
    if (!bulk_ok) return 0;
    double best_bulk = 1e30;
    for (const auto& c : bulk_configs) {
      if (!bulk_fits(c[0], c[1], c[2])) continue;
      const double us = time_us(sa, sb, [&] { bulk(sms * c[2], c[0], c[1], sa); });
      if (us < best_bulk) best_bulk = us;
      std::printf("  bulk copies (queue): %d CTAs of %2d warps per SM, %2d rows in flight per warp: %8.1f us  %5.2f TB/s\n",
                  c[2], c[0], c[1], us, tbs(us));
    }
    std::printf("best bulk: %.1f us, %.2f TB/s\n", best_bulk, tbs(best_bulk));
    return 0;
  }

  Gemm gemm;
  gemm.m = m;
  gemm.n = rows;
  gemm.k = k;
  gemm.ws_bytes = size_t(32) << 20;
  void *x = nullptr, *wg = nullptr, *g = nullptr;
  check(cudaMalloc(&x, size_t(m * k) * 2), "x");
  check(cudaMalloc(&wg, size_t(rows * k) * 2), "gate weight");
  check(cudaMalloc(&g, size_t(m * rows) * 2), "gate output");
  check(cudaMalloc(&gemm.ws, gemm.ws_bytes), "cuBLASLt workspace");
  check(cudaMemset(x, 0, size_t(m * k) * 2), "x");
  check(cudaMemset(wg, 0, size_t(rows * k) * 2), "gate weight");
  gemm.x = x;
  gemm.w = wg;
  gemm.g = g;
  check_lt(cublasLtCreate(&gemm.lt), "cuBLASLt handle");
  auto gather = [&](int ctas, cudaStream_t s) {
    gather_queue_kernel<4><<<unsigned(ctas), 128, 0, s>>>(w, row_vecs, idx, entries, head, out);
  };
  const double gemm_us = time_us(sa, sb, [&] { gemm.run(0, sa); });
  const double gather_us = time_us(sa, sb, [&] { gather(sms * 8, sb); });
  const double seq_us = time_us(sa, sb, [&] {
    gemm.run(0, sa);
    gather(sms * 8, sa);
  });
  std::printf(
      "GEMM relu(x W^T), M = %lld, alone: %.1f us; gather alone (queue, 8 CTAs per SM): %.1f us "
      "(%.2f TB/s); in sequence: %.1f us\n",
      (long long)m, gemm_us, gather_us, tbs(gather_us), seq_us);
  double best = 1e30;
  for (int target : {sms * 85 / 100, sms * 76 / 100, sms * 68 / 100, sms * 61 / 100, sms / 2}) {
    std::printf("  GEMM for %3d SMs alone %7.1f us; both at once, gather CTAs:", target,
                time_us(sa, sb, [&] { gemm.run(target, sa); }));
    for (int c : {4, 8}) {
      const int ctas = (sms - target) * c;
      const double us = time_us(sa, sb, [&] {
        gemm.run(target, sa);
        gather(ctas, sb);
      });
      if (us < best) best = us;
      std::printf("  %4d: %7.1f us", ctas, us);
    }
    std::printf("\n");
  }
  std::printf("best together: %.1f us against %.1f in sequence (%.0f%% less)\n", best, seq_us,
              100 * (1 - best / seq_us));

  // The same with a split the hardware guarantees: green contexts of G SMs (the GEMM's stream) and
  // the rest (the gather's), in the driver's partition granularity.
  CUdevice cu_dev;
  CUdevResource all{};
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&cu_dev, dev) != CUDA_SUCCESS ||
      cuDeviceGetDevResource(cu_dev, &all, CU_DEV_RESOURCE_TYPE_SM) != CUDA_SUCCESS) {
    std::printf("green contexts: not available here\n");
    return 0;
  }
  std::printf("green contexts: %u SMs, partitions of at least %u in steps of %u\n", all.sm.smCount,
              all.sm.minSmPartitionSize, all.sm.smCoscheduledAlignment);
  double best_green = 1e30;
  for (int target : {sms * 73 / 100, sms * 67 / 100, sms * 61 / 100, sms * 55 / 100}) {
    CUdevResource part{}, rest{};
    unsigned groups = 1;
    CUdevResourceDesc part_desc, rest_desc;
    CUgreenCtx part_ctx, rest_ctx;
    CUstream part_stream, rest_stream;
    if (cuDevSmResourceSplitByCount(&part, &groups, &all, &rest, 0, unsigned(target)) != CUDA_SUCCESS ||
        groups != 1 || cuDevResourceGenerateDesc(&part_desc, &part, 1) != CUDA_SUCCESS ||
        cuDevResourceGenerateDesc(&rest_desc, &rest, 1) != CUDA_SUCCESS ||
        cuGreenCtxCreate(&part_ctx, part_desc, cu_dev, CU_GREEN_CTX_DEFAULT_STREAM) != CUDA_SUCCESS ||
        cuGreenCtxCreate(&rest_ctx, rest_desc, cu_dev, CU_GREEN_CTX_DEFAULT_STREAM) != CUDA_SUCCESS ||
        cuGreenCtxStreamCreate(&part_stream, part_ctx, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS ||
        cuGreenCtxStreamCreate(&rest_stream, rest_ctx, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS) {
      std::printf("  a split of %d SMs failed\n", target);
      continue;
    }
    const int gemm_sms = int(part.sm.smCount), rest_sms = int(rest.sm.smCount);
    const cudaStream_t a = part_stream, b = rest_stream;
    const double gemm_alone = time_us(a, b, [&] { gemm.run(gemm_sms, a); });
    const double gather_alone = time_us(a, b, [&] { gather(rest_sms * 8, b); });
    const double together = time_us(a, b, [&] {
      gemm.run(gemm_sms, a);
      gather(rest_sms * 8, b);
    });
    if (together < best_green) best_green = together;
    std::printf(
        "  GEMM on %3d SMs alone %7.1f us, gather on the other %3d alone %7.1f us (%.0f GB/s per SM), "
        "together %7.1f us\n",
        gemm_sms, gemm_alone, rest_sms, gather_alone, bytes / (gather_alone * 1e3) / rest_sms, together);
    if (bulk_ok) {  // the bulk-copy gather on the same SMs: the configuration fastest alone
      double alone = 1e30;
      const int* best_c = nullptr;
      for (const auto& c : bulk_configs) {
        if (!bulk_fits(c[0], c[1], c[2])) continue;
        const double us = time_us(a, b, [&] { bulk(rest_sms * c[2], c[0], c[1], b); });
        if (us < alone) alone = us, best_c = c;
      }
      if (best_c != nullptr) {
        const double both = time_us(a, b, [&] {
          gemm.run(gemm_sms, a);
          bulk(rest_sms * best_c[2], best_c[0], best_c[1], b);
        });
        if (both < best_green) best_green = both;
        std::printf(
            "    bulk copies (%d CTAs of %d warps x %d slots per SM, the fastest alone): alone %7.1f us "
            "(%.0f GB/s per SM), together %7.1f us\n",
            best_c[2], best_c[0], best_c[1], alone, bytes / (alone * 1e3) / rest_sms, both);
      }
    }
    cuStreamDestroy(part_stream);
    cuStreamDestroy(rest_stream);
    cuGreenCtxDestroy(part_ctx);
    cuGreenCtxDestroy(rest_ctx);
  }
  std::printf("best together (green contexts): %.1f us against %.1f in sequence (%.0f%% less)\n", best_green,
              seq_us, 100 * (1 - best_green / seq_us));
  return 0;
}
